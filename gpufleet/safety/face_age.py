"""Faces and their apparent age: face-api's tiny face detector and age/gender net, re-run in torch.

Contract:
- The weights are the TF.js files of the npm package ``@vladmandic/face-api`` 1.7.15 (MIT, its
  ``LICENSE`` beside them), copied unchanged into ``gpufleet/safety/face_api/`` (620 KB) and
  hash-checked on load (:data:`WEIGHTS_SHA256`); nothing is downloaded. The architectures are
  re-implemented from the package's TypeScript sources (its source map): the detector is a tiny
  YOLOv2 (a 3×3 convolution, five depthwise-separable convolutions with leaky ReLU and max pooling,
  a 1×1 head; 416×416 input, five anchors), the age net a tiny Xception (two reduction blocks, two
  residual blocks, an exit block) with a linear age head on 112×112 face crops. TensorFlow's
  ``same`` padding and its legacy bilinear resize are reproduced.
- :func:`detect_faces` returns the faces (score ≥ ``min_score``, non-maximum suppressed at IoU 0.4)
  of a uint8 RGB frame as (x, y, width, height, score) in pixels; :func:`face_ages` the apparent
  age in years of each; :func:`minor_likeness` maps an age to [0, 1]: 1 at 13 and under, 0 at 21
  and over, linear between (the age net's error is several years, so the band is wide).
- Loading costs a few milliseconds; a 256-px frame about 10-20 ms on one core.
"""

from __future__ import annotations

import hashlib
import json
import threading
from importlib import resources

import numpy as np

from gpufleet.errors import ConfigError

WEIGHTS_SHA256 = {
    "tiny_face_detector_model.bin": "b7503ce7df31039b1c43316a9b865cab6a70dd748cc602d3fa28b551503c3871",
    "age_gender_model.bin": "49f92bbc0afef2342c4385e4a2b0acb6d7a727c6f0aa539499719a81acf9abaa",
}
ANCHORS = ((1.603231, 2.094468), (6.041143, 7.080126), (2.882459, 3.518061), (4.266906, 5.178857), (9.041765, 10.66308))
DETECTOR_MEAN_RGB = (117.001, 114.697, 97.404)
AGE_MEAN_RGB = (122.782, 117.001, 104.298)
DETECTOR_SIZE = 416
AGE_SIZE = 112
IOU_THRESHOLD = 0.4
_lock = threading.Lock()
_weights: dict[str, dict] = {}


def load_weights(model: str) -> dict:
    """{name: torch tensor} of ``model`` (``tiny_face_detector_model`` or ``age_gender_model``), dequantised."""
    with _lock:
        if model not in _weights:
            import torch

            folder = resources.files("gpufleet.safety") / "face_api"
            data = (folder / f"{model}.bin").read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest != WEIGHTS_SHA256[f"{model}.bin"]:
                raise ConfigError(
                    f"face_api/{model}.bin has sha256 {digest}, expected {WEIGHTS_SHA256[model + '.bin']}"
                )
            manifest = json.loads((folder / f"{model}-weights_manifest.json").read_text())
            out, offset = {}, 0
            for spec in (w for group in manifest for w in group["weights"]):
                count = int(np.prod(spec["shape"])) if spec["shape"] else 1
                q = spec.get("quantization")
                if q:
                    raw = np.frombuffer(data, np.uint8, count, offset).astype(np.float32)
                    values, offset = raw * q["scale"] + q["min"], offset + count
                else:
                    values, offset = np.frombuffer(data, np.float32, count, offset), offset + 4 * count
                out[spec["name"]] = torch.from_numpy(np.array(values, np.float32).reshape(spec["shape"]))
            if offset != len(data):
                raise ConfigError(f"face_api/{model}.bin holds {len(data)} bytes, its manifest {offset}")
            _weights[model] = out
        return _weights[model]


def _pad_same(x, k: int, s: int, value: float = 0.0):
    """TensorFlow ``same`` padding (the extra pixel at the bottom / right) for a k×k window at stride s."""
    import torch.nn.functional as F

    h, w = x.shape[-2:]
    ph = max((-(-h // s) - 1) * s + k - h, 0)
    pw = max((-(-w // s) - 1) * s + k - w, 0)
    return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=value)


def _conv(x, w, b, stride: int = 1, same: bool = True):
    import torch.nn.functional as F

    filt = w.permute(3, 2, 0, 1)  # [kh, kw, in, out] → [out, in, kh, kw]
    if same:
        x = _pad_same(x, filt.shape[-1], stride)
    return F.conv2d(x, filt, b, stride=stride)


def _separable(x, p: dict, prefix: str, same: bool = True):
    import torch.nn.functional as F

    depth = p[f"{prefix}/depthwise_filter"].permute(2, 3, 0, 1)  # [kh, kw, in, 1] → [in, 1, kh, kw]
    x = _pad_same(x, 3, 1) if same else x
    x = F.conv2d(x, depth, groups=depth.shape[0])
    return F.conv2d(x, p[f"{prefix}/pointwise_filter"].permute(3, 2, 0, 1), p[f"{prefix}/bias"])


def _max_pool(x, k: int, s: int):
    import torch.nn.functional as F

    return F.max_pool2d(_pad_same(x, k, s, value=float("-inf")), k, s)


def _leaky(x):
    return x - 0.9 * x.clamp(max=0)  # max(x, 0.1 x), as the package computes it


def resize_bilinear(img: np.ndarray, size: int) -> np.ndarray:
    """TensorFlow's legacy bilinear resize (no half-pixel centres) of (H, W, C) float32 to size×size."""
    h, w = img.shape[:2]
    ys, xs = np.arange(size) * (h / size), np.arange(size) * (w / size)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


def _square(img: np.ndarray, centre: bool) -> np.ndarray:
    """Zero-pad the shorter side (at the end, or on both sides when ``centre``) as face-api's padToSquare."""
    h, w = img.shape[:2]
    if h == w:
        return img
    diff = abs(h - w)
    after = int(np.floor(diff * 0.5 + 0.5)) if centre else diff
    before = diff - after
    pad = ((before, after), (0, 0), (0, 0)) if h < w else ((0, 0), (before, after), (0, 0))
    return np.pad(img, pad)


def _batch(img: np.ndarray, size: int, mean, centre: bool):
    import torch

    sq = resize_bilinear(_square(img.astype(np.float32), centre), size)
    arr = (sq - np.array(mean, np.float32)) / 255.0
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))[None]


def _iou(a, b) -> float:
    ix = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter + 1e-9)


def detect_faces(frame: np.ndarray, min_score: float = 0.5) -> list[tuple[float, float, float, float, float]]:
    """Faces in a uint8 RGB frame: (x, y, width, height, score) in pixels, best first."""
    import torch

    p = load_weights("tiny_face_detector_model")
    h, w = frame.shape[:2]
    with torch.inference_mode():
        x = _batch(frame, DETECTOR_SIZE, DETECTOR_MEAN_RGB, centre=False)
        x = _leaky(_conv(x, p["conv0/filters"], p["conv0/bias"], same=False))
        for i in range(1, 6):
            x = _max_pool(x, 2, 2)
            x = _leaky(_separable(x, p, f"conv{i}"))
        x = _max_pool(x, 2, 1)
        out = _conv(x, p["conv8/filters"], p["conv8/bias"], same=False)[0].permute(1, 2, 0).numpy()
    cells = out.shape[0]
    out = out.reshape(cells, cells, len(ANCHORS), 5)
    side = max(h, w)
    scores = 1 / (1 + np.exp(-out[..., 4]))
    found = []
    for row, col, a in zip(*np.nonzero(scores > min_score), strict=True):
        tx, ty, tw, th = out[row, col, a, :4]
        cx, cy = (col + 1 / (1 + np.exp(-tx))) / cells, (row + 1 / (1 + np.exp(-ty))) / cells
        bw, bh = np.exp(tw) * ANCHORS[a][0] / cells, np.exp(th) * ANCHORS[a][1] / cells
        found.append(((cx - bw / 2) * side, (cy - bh / 2) * side, bw * side, bh * side, float(scores[row, col, a])))
    found.sort(key=lambda f: -f[4])
    kept: list = []
    for f in found:
        if all(_iou(f, k) <= IOU_THRESHOLD for k in kept):
            kept.append(f)
    return kept


def _crop(frame: np.ndarray, box) -> np.ndarray | None:
    h, w = frame.shape[:2]
    x, y = max(box[0], 0.0), max(box[1], 0.0)
    cw, ch = min(box[0] + box[2] - x, w - x), min(box[1] + box[3] - y, h - y)
    x, y, cw, ch = int(np.floor(x)), int(np.floor(y)), int(np.floor(cw)), int(np.floor(ch))
    return frame[y : y + ch, x : x + cw] if cw > 0 and ch > 0 else None


def face_ages(frame: np.ndarray, faces) -> list[float]:
    """The apparent age in years of each face box of the frame (the age net's linear head)."""
    import torch
    import torch.nn.functional as F

    p = load_weights("age_gender_model")
    crops = [c for c in (_crop(frame, f) for f in faces) if c is not None]
    if not crops:
        return []

    def reduction(x, prefix, activate=True):
        out = F.relu(x) if activate else x
        out = _separable(out, p, f"{prefix}/separable_conv0")
        out = _separable(F.relu(out), p, f"{prefix}/separable_conv1")
        out = _max_pool(out, 3, 2)
        return out + _conv(x, p[f"{prefix}/expansion_conv/filters"], p[f"{prefix}/expansion_conv/bias"], stride=2)

    with torch.inference_mode():
        x = torch.cat([_batch(c, AGE_SIZE, AGE_MEAN_RGB, centre=True) for c in crops])
        x = F.relu(_conv(x, p["entry_flow/conv_in/filters"], p["entry_flow/conv_in/bias"], stride=2))
        x = reduction(x, "entry_flow/reduction_block_0", activate=False)
        x = reduction(x, "entry_flow/reduction_block_1")
        for i in range(2):
            pre = f"middle_flow/main_block_{i}"
            out = _separable(F.relu(x), p, f"{pre}/separable_conv0")
            out = _separable(F.relu(out), p, f"{pre}/separable_conv1")
            x = _separable(F.relu(out), p, f"{pre}/separable_conv2") + x
        x = reduction(x, "exit_flow/reduction_block")
        x = F.relu(_separable(x, p, "exit_flow/separable_conv"))
        pooled = F.avg_pool2d(x, 7, 2).flatten(1)
        ages = pooled @ p["fc/age/weights"] + p["fc/age/bias"]
    return [float(a) for a in ages[:, 0]]


def minor_likeness(age: float) -> float:
    """1 at 13 years and under, 0 at 21 and over, linear between."""
    return float(np.clip((21.0 - age) / 8.0, 0.0, 1.0))
