"""Which frames of a video tier-2 moderation scores: scene changes plus a uniform floor (pure).

Contract:
- :func:`scene_diffs` turns frames (N, H, W, 3) uint8 into N-1 change scores in [0, 1]: the mean
  absolute difference of consecutive frames' 8×8 RGB thumbnails (block means), over 255. A hard
  cut scores high (two unrelated images: typically 0.15-0.5); motion inside a shot scores low
  (a pan or a moving subject: typically under 0.05).
- :meth:`SamplingPolicy.indices` picks the frames to score from the frame count and those scores:
  every frame when the clip has at most ``max_frames`` frames (a short clip is checked whole);
  otherwise a uniform floor of ``min(floor, max_frames)`` evenly spaced frames (always the first
  and the last), then the first frame of each scene (a frame whose change score reaches
  ``cut_threshold``), largest changes first, until ``max_frames`` frames are chosen. The result is
  sorted and unique; a cut that does not fit under ``max_frames`` is dropped (its frame may still
  lie on the floor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: frames checked per video unless a tenant's profile says otherwise (safety profile ``max_frames``)
DEFAULT_MAX_FRAMES = 32
_THUMB = 8


def thumbnails(frames: np.ndarray, side: int = _THUMB) -> np.ndarray:
    """(N, side, side, 3) float32 block means of (N, H, W, 3) frames (edges cropped to a multiple of side)."""
    n, h, w = frames.shape[:3]
    bh, bw = max(h // side, 1), max(w // side, 1)
    cropped = frames[:, : bh * side, : bw * side].astype(np.float32)
    rows, cols = cropped.shape[1] // bh, cropped.shape[2] // bw
    return cropped.reshape(n, rows, bh, cols, bw, -1).mean(axis=(2, 4))


def scene_diffs(frames: np.ndarray) -> np.ndarray:
    """N-1 change scores in [0, 1]: consecutive thumbnails' mean absolute difference / 255."""
    if len(frames) < 2:
        return np.zeros(0, dtype=np.float32)
    thumbs = thumbnails(frames)
    return (np.abs(np.diff(thumbs, axis=0)).mean(axis=(1, 2, 3)) / 255.0).astype(np.float32)


def _uniform(n: int, k: int) -> set[int]:
    if k <= 1:
        return {0}
    return {int(round(i * (n - 1) / (k - 1))) for i in range(k)}


@dataclass(frozen=True)
class SamplingPolicy:
    """Frame selection: ``max_frames`` at most (every frame of a shorter clip), a ``floor`` of evenly
    spaced frames, and the first frame of each scene whose change score reaches ``cut_threshold``."""

    max_frames: int = DEFAULT_MAX_FRAMES
    floor: int = 8
    cut_threshold: float = 0.12

    def __post_init__(self) -> None:
        if self.max_frames < 1 or self.floor < 1:
            raise ValueError("max_frames and floor must be at least 1")
        if not 0 < self.cut_threshold <= 1:
            raise ValueError("cut_threshold must be in (0, 1]")

    def indices(self, n: int, diffs: Sequence[float] | np.ndarray = ()) -> list[int]:
        """The frames to score among ``n``; ``diffs[i]`` is the change from frame i to i+1 (see module doc)."""
        if n <= 0:
            return []
        if n <= self.max_frames:
            return list(range(n))
        chosen = _uniform(n, min(self.floor, self.max_frames))
        cuts = sorted(
            ((float(d), i + 1) for i, d in enumerate(diffs[: n - 1]) if d >= self.cut_threshold),
            key=lambda c: (-c[0], c[1]),
        )
        for _, frame in cuts:
            if len(chosen) >= self.max_frames:
                break
            chosen.add(frame)
        return sorted(chosen)
