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


def _colour_test(rgb: np.ndarray) -> np.ndarray:
    """The contract's HSV test on float32 RGB pixels in [0, 1] (..., 3): boolean (...)."""
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


def blood_mask(frame: np.ndarray) -> np.ndarray:
    """Boolean (H, W): the pixels of blood colour (see the module contract).

    Only the pixels whose red is at least twice the green and at least the blue go through the float test: on the
    uint8 values these two comparisons decide exactly as the test's own (x / 255 is monotonic, and 2 g / 255 is
    2 × (g / 255) exactly), and every other pixel fails them there, so the mask is the same as testing every pixel,
    at a fraction of the work on frames with little red."""
    px = np.asarray(frame)
    r = px[..., 0].astype(np.int16)
    candidates = (r >= 2 * px[..., 1].astype(np.int16)) & (r >= px[..., 2])
    mask = np.zeros(px.shape[:-1], dtype=bool)
    mask[candidates] = _colour_test(px[candidates].astype(np.float32) / 255.0)
    return mask


def blood_share(frame: np.ndarray) -> float:
    """Fraction of the frame's pixels of blood colour, in [0, 1]."""
    return float(blood_mask(frame).mean())
