"""Per-tenant safety profiles: the tier-2 (frame moderation) settings an operator sets for a tenant (pure).

Contract:
- :class:`SafetyProfile` is what the control table holds for a tenant
  (``SAFETY#<tenant>`` / ``SAFETY``, :mod:`gpufleet.store.safety_profiles`):
  ``frame_thresholds`` {category: threshold in (0, 1]} override the backend's
  defaults per category (empty: the backend's defaults); ``backend`` (None: the
  deployment's ``GPUFLEET_MODERATION_BACKEND``); ``max_frames`` checked per video
  (None: the default, :data:`~gpufleet.safety.frame_selection.DEFAULT_MAX_FRAMES`; else 2..64: a clip
  that long or shorter is checked whole, a longer one on a uniform floor plus its scene changes); ``version`` (1, 2, ... one per write) and
  ``updated_at`` / ``updated_by``. Categories must be ones the named backend
  scores; with no backend named, ones some backend scores. Only operators write
  it; nothing the submitting user sends reaches it.
- :func:`resolve` turns a tenant's profile (or ``None``: no profile) into the
  :class:`FrozenSafety` that CheckPrompt stores on the job item as ``safety``:
  ``{"source": "tenant"|"default", "profile_version" (0 for the default),
  "frame_thresholds", "backend", "max_frames", "resolved_at"}``. The finalize
  stage moderates with exactly those settings (:meth:`FrozenSafety.moderator`),
  so a later profile edit never changes a job already past CheckPrompt.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.safety.frames import BACKENDS, FrameModerator, SamplingPolicy, categories, moderator

Threshold = Annotated[float, Field(gt=0, le=1)]
MaxFrames = Annotated[int, Field(ge=2, le=64)]
_TENANT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


def _check_categories(thresholds: dict[str, float], backend: str | None) -> None:
    """Raise ValueError when a threshold names a category the backend (or, with none named, every backend)
    does not score, or when the backend is unknown."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown moderation backend {backend!r} (known: {', '.join(sorted(BACKENDS))})")
    known = set(categories(backend)) if backend else {c for b in BACKENDS for c in categories(b)}
    unknown = sorted(set(thresholds) - known)
    if unknown:
        raise ValueError(f"unknown moderation categories {unknown} for backend {backend or 'any'!r} "
                         f"(known: {sorted(known)})")


class SafetyProfile(BaseModel):
    """A tenant's tier-2 safety profile (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=_TENANT)
    frame_thresholds: dict[str, Threshold] = Field(default_factory=dict)
    backend: str | None = None
    max_frames: MaxFrames | None = None
    version: int = Field(ge=1)
    updated_at: str = Field(min_length=1)
    updated_by: str | None = None

    @model_validator(mode="after")
    def _categories(self) -> SafetyProfile:
        _check_categories(self.frame_thresholds, self.backend)
        return self

    def is_default(self) -> bool:
        """True when the profile changes nothing (cleared): the deployment's settings apply."""
        return not self.frame_thresholds and self.backend is None and self.max_frames is None


class FrozenSafety(BaseModel):
    """The tier-2 settings frozen onto a job at CheckPrompt (job item attribute ``safety``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    source: Literal["tenant", "default"]
    profile_version: int = Field(ge=0)
    frame_thresholds: dict[str, Threshold] = Field(default_factory=dict)
    backend: str | None = None
    max_frames: MaxFrames | None = None
    resolved_at: str | None = None

    def moderator(self, default_backend: str, threads: int | None = None) -> FrameModerator:
        """The frame moderator these settings describe; ``default_backend`` when none is frozen; ``threads``
        bounds the model's CPU threads (None: the runtime's default).

        Raises :class:`gpufleet.errors.ConfigError` when a frozen threshold names a category that
        backend does not score (fail closed: a strict profile must not silently stop applying)."""
        sampling = SamplingPolicy(self.max_frames) if self.max_frames else None
        return moderator(self.backend or default_backend, sampling, dict(self.frame_thresholds) or None, threads)

    def as_item(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def resolve(profile: SafetyProfile | None, resolved_at: str) -> FrozenSafety:
    """The effective tier-2 settings for a job of the profile's tenant; the deployment default when ``None``."""
    if profile is None:
        return FrozenSafety(source="default", profile_version=0, resolved_at=resolved_at)
    return FrozenSafety(source="tenant", profile_version=profile.version, frame_thresholds=profile.frame_thresholds,
                        backend=profile.backend, max_frames=profile.max_frames, resolved_at=resolved_at)


def parse_thresholds(pairs: list[str]) -> dict[str, float]:
    """``["exposed_skin=0.03", ...]`` → ``{"exposed_skin": 0.03}``; raises ValueError on a malformed pair."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"threshold {pair!r} is not CATEGORY=VALUE")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"threshold {pair!r}: {value!r} is not a number")
    return out
