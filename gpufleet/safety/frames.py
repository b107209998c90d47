"""Tier-2 safety: frame-level moderation of generated video, behind a small interface.

Contract:
- :class:`SamplingPolicy` picks which frames are checked: the first, the last
  and evenly spaced ones in between, at most ``max_frames`` (all when fewer).
- A :class:`FrameBackend` scores one uint8 RGB frame → {category: score in [0, 1]}.
- :class:`FrameModerator` samples, scores, and blocks when any category's
  score reaches its threshold on any sampled frame; :class:`ModerationResult`
  records the backend, the sampled indices, the worst scores, the thresholds
  applied and the verdict.
- :func:`moderator` builds one by backend name; ``thresholds`` overrides the
  backend's default per category (a tenant's safety profile,
  :mod:`gpufleet.safety.profile`); a category the backend does not score is a
  :class:`ConfigError` (an override that could never apply must not pass silently).
- Backends (by name, :func:`moderator`; each lists its ``CATEGORIES``):
  ``skin``  built in: the share of skin-tone pixels (YCbCr ranges of Chai &
            Ngan) in the frame, a coarse nudity signal (category ``exposed_skin``);
  ``nudenet`` optional: NudeNet's ONNX detector (AGPL-3.0; not a dependency —
            install it yourself); a missing package raises ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpufleet.errors import ConfigError


@dataclass(frozen=True)
class SamplingPolicy:
    max_frames: int = 8

    def indices(self, n: int) -> list[int]:
        if n <= 0:
            return []
        if n <= self.max_frames:
            return list(range(n))
        return sorted({int(round(i * (n - 1) / (self.max_frames - 1))) for i in range(self.max_frames)})


class FrameBackend(Protocol):
    name: str
    thresholds: dict[str, float]

    def score(self, frame: np.ndarray) -> dict[str, float]: ...


class SkinExposureBackend:
    """Share of skin-tone pixels: Cb in [77, 127], Cr in [133, 173] (Chai & Ngan, 1999)."""

    name = "skin"
    CATEGORIES = ("exposed_skin",)

    def __init__(self, threshold: float = 0.6) -> None:
        self.thresholds = {"exposed_skin": threshold}

    def score(self, frame: np.ndarray) -> dict[str, float]:
        rgb = frame.astype(np.float32)
        r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
        cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
        cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
        skin = (cb >= 77) & (cb <= 127) & (cr >= 133) & (cr <= 173)
        return {"exposed_skin": float(skin.mean())}


class NudeNetBackend:
    """NudeNet detector (optional, AGPL-3.0): max detection score over exposed-body classes."""

    name = "nudenet"
    CATEGORIES = ("nudity",)
    EXPOSED = ("FEMALE_BREAST_EXPOSED", "FEMALE_GENITALIA_EXPOSED", "MALE_GENITALIA_EXPOSED",
               "ANUS_EXPOSED", "BUTTOCKS_EXPOSED")

    def __init__(self, threshold: float = 0.5) -> None:
        try:
            from nudenet import NudeDetector
        except ImportError:
            raise ConfigError("the nudenet moderation backend needs the optional nudenet package")
        self._detector = NudeDetector()
        self.thresholds = {"nudity": threshold}

    def score(self, frame: np.ndarray) -> dict[str, float]:
        found = self._detector.detect(np.ascontiguousarray(frame[:, :, ::-1]))
        best = max((d["score"] for d in found if d.get("class") in self.EXPOSED), default=0.0)
        return {"nudity": float(best)}


@dataclass
class ModerationResult:
    blocked: bool
    backend: str
    category: str | None
    scores: dict[str, float]
    frames_checked: list[int] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"blocked": self.blocked, "backend": self.backend, "category": self.category,
                "scores": {k: round(v, 4) for k, v in self.scores.items()}, "frames_checked": self.frames_checked,
                "thresholds": dict(self.thresholds)}


class FrameModerator:
    def __init__(self, backend: FrameBackend, sampling: SamplingPolicy | None = None) -> None:
        self.backend = backend
        self.sampling = sampling or SamplingPolicy()

    def moderate(self, frames: np.ndarray) -> ModerationResult:
        idx = self.sampling.indices(len(frames))
        worst: dict[str, float] = {k: 0.0 for k in self.backend.thresholds}
        for i in idx:
            for k, v in self.backend.score(frames[i]).items():
                worst[k] = max(worst.get(k, 0.0), v)
        over = [(v, k) for k, v in worst.items() if v >= self.backend.thresholds.get(k, 1.0)]
        category = max(over)[1] if over else None
        return ModerationResult(bool(over), self.backend.name, category, worst, idx, dict(self.backend.thresholds))


BACKENDS = {"skin": SkinExposureBackend, "nudenet": NudeNetBackend}


def categories(name: str) -> tuple[str, ...]:
    """The categories backend ``name`` scores; an unknown backend is a :class:`ConfigError`."""
    try:
        return BACKENDS[name].CATEGORIES
    except KeyError:
        raise ConfigError(f"unknown moderation backend {name!r} (known: {', '.join(sorted(BACKENDS))})")


def moderator(name: str = "skin", sampling: SamplingPolicy | None = None,
              thresholds: dict[str, float] | None = None) -> FrameModerator:
    """Backend ``name`` with its default thresholds, overridden per category by ``thresholds``."""
    known = categories(name)
    unknown = sorted(set(thresholds or {}) - set(known))
    if unknown:
        raise ConfigError(f"moderation backend {name!r} does not score {', '.join(unknown)} "
                          f"(it scores: {', '.join(known)})")
    backend = BACKENDS[name]()
    backend.thresholds = {**backend.thresholds, **{k: float(v) for k, v in (thresholds or {}).items()}}
    return FrameModerator(backend, sampling)
