"""A colour heuristic for graphic violence: the share of a frame that has the colour of blood (pure numpy).

No learned violence or gore classifier ships in a registry package with a licence that permits a
hosted service (docs/security.md "Tier-2 moderation" lists what was searched), so the
``graphic_violence`` category is this heuristic, with its measured behaviour in docs/benchmarks.md.

Contract: :func:`blood_share` of a uint8 RGB frame is the fraction of pixels whose HSV colour is a
saturated, dark-to-mid red: hue within 12° of red (≥ 348° or ≤ 12°), saturation ≥ 0.55,
value in [0.12, 0.70], and red at least twice green. Bright reds (paint, a fire engine: value above
0.70) and skin (saturation under 0.55) fall outside. Dark red objects (wine, red fabric in shadow,
ketchup) do not: that is the heuristic's known false-positive class.
"""

from __future__ import annotations

import numpy as np

HUE_HALF_WIDTH = 12.0
MIN_SATURATION = 0.55
VALUE_RANGE = (0.12, 0.70)


def blood_mask(frame: np.ndarray) -> np.ndarray:
    """Boolean (H, W): the pixels of blood colour (see the module contract)."""
    rgb = frame.astype(np.float32) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    v = rgb.max(axis=-1)
    c = v - rgb.min(axis=-1)
    s = np.where(v > 0, c / np.maximum(v, 1e-6), 0.0)
    red_max = (r >= g) & (r >= b) & (c > 0)
    hue = np.where(red_max, 60.0 * (g - b) / np.maximum(c, 1e-6), 180.0)  # in (-60, 60] where red is the max
    return (
        red_max
        & (np.abs(hue) <= HUE_HALF_WIDTH)
        & (s >= MIN_SATURATION)
        & (v >= VALUE_RANGE[0])
        & (v <= VALUE_RANGE[1])
        & (r >= 2.0 * g)
    )


def blood_share(frame: np.ndarray) -> float:
    """Fraction of the frame's pixels of blood colour, in [0, 1]."""
    return float(blood_mask(frame).mean())
