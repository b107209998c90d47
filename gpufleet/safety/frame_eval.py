"""Recall and false-positive rate of a tier-2 backend on a labelled frame set (pure but for reading files).

Contract:
- A frame set is a folder with ``labels.json`` ``{file: {"label": "safe" | <category>, ...}}`` and the
  images (tests/data/frames, built by benchmarks/frame_set.py).
- :func:`evaluate` takes each frame's scores and label and the thresholds, and returns per category
  ``{"positives", "recall" (None without positives), "negatives", "fpr"}``: recall is the share of
  frames labelled with the category whose score for it reaches its threshold; the false-positive
  rate is the share of ``safe`` frames whose score for that category reaches its threshold. The
  ``"any"`` entry counts a frame as flagged when any enforced category flags it (every unsafe frame
  a positive).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

SAFE = "safe"


def load_frame_set(folder: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """(file names, labels, uint8 RGB frames (N, H, W, 3)) in file-name order."""
    from PIL import Image

    folder = Path(folder)
    labels = json.loads((folder / "labels.json").read_text())
    names = sorted(labels)
    frames = np.stack([np.asarray(Image.open(folder / n).convert("RGB")) for n in names])
    return names, [labels[n]["label"] for n in names], frames


def _rate(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def evaluate(
    scores: Sequence[Mapping[str, float]], labels: Sequence[str], thresholds: Mapping[str, float]
) -> dict[str, dict]:
    """Per enforced category and ``"any"``: positives, recall, negatives, fpr (see the module doc)."""
    safe = [s for s, lab in zip(scores, labels, strict=True) if lab == SAFE]
    out: dict[str, dict] = {}
    for cat, limit in sorted(thresholds.items()):
        pos = [s for s, lab in zip(scores, labels, strict=True) if lab == cat]
        out[cat] = {
            "positives": len(pos),
            "recall": _rate(sum(s[cat] >= limit for s in pos), len(pos)),
            "negatives": len(safe),
            "fpr": _rate(sum(s[cat] >= limit for s in safe), len(safe)),
        }

    def flagged(s: Mapping[str, float]) -> bool:
        return any(s[c] >= t for c, t in thresholds.items())

    unsafe = [s for s, lab in zip(scores, labels, strict=True) if lab != SAFE]
    out["any"] = {
        "positives": len(unsafe),
        "recall": _rate(sum(map(flagged, unsafe)), len(unsafe)),
        "negatives": len(safe),
        "fpr": _rate(sum(map(flagged, safe)), len(safe)),
    }
    return out
