"""What the watermark must survive: procedural test clips and the transforms of the robustness table.

Contract:
- :func:`natural_clip(n, side, seed)`: uint8 RGB frames with natural-image statistics (a 1/f²
  power spectrum per channel, plus hard-edged shapes), panning 3 px a frame across a larger scene.
- :func:`generated_clip(n, side, seed)`: smooth, low-texture frames like a small text-to-video model's
  (drifting colour gradients and soft blobs).
- :data:`TRANSFORMS`: name → function(frames) → frames, the attacks the watermark is measured
  against: H.264 re-encode at CRF 35 (PyAV/libx264), 0.5× scaling, a 10 % crop (of each side's
  length, off-centre), a 4-px shift (edge-replicated), a horizontal flip, one frame as JPEG at
  quality 50 (OpenCV), and a scale to under 256 px (0.45×).
- :func:`remux`: a stream copy into a new MP4, which drops the C2PA manifest.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _pink(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f
    img = np.fft.irfft2(spec, s=(h, w))
    return (img - img.mean()) / (img.std() + 1e-9)


def natural_clip(n: int = 16, side: int = 512, seed: int = 0) -> np.ndarray:
    import cv2

    rng = np.random.default_rng(seed)
    big = side + 3 * n + 8
    scene = np.stack([_pink(rng, big, big) for _ in range(3)], axis=-1)
    mix = np.array([[0.8, 0.15, 0.05], [0.15, 0.7, 0.15], [0.05, 0.2, 0.75]])
    scene = 120 + 38 * scene @ mix
    canvas = np.ascontiguousarray(scene.astype(np.float32))
    for _ in range(12):
        c = tuple(float(v) for v in rng.integers(20, 235, 3))
        x, y, r = (int(v) for v in rng.integers(0, big, 3))
        cv2.circle(canvas, (x, y), r // 6 + 8, c, -1)
        cv2.rectangle(canvas, (y, x), (y + r // 5, x + r // 7), c[::-1], -1)
    canvas = np.clip(canvas, 0, 255).astype(np.uint8)
    return np.stack([canvas[4 + i : 4 + i + side, 3 * i : 3 * i + side] for i in range(n)])


def generated_clip(n: int = 16, side: int = 256, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    blobs = rng.uniform(0, 1, size=(5, 2)), rng.uniform(0.08, 0.2, 5), rng.uniform(40, 200, size=(5, 3))
    frames = []
    for t in range(n):
        img = np.stack([90 + 60 * xx + 10 * t / n, 70 + 80 * yy, 150 - 50 * xx * yy], axis=-1)
        for (cy, cx), r, col in zip(blobs[0], blobs[1], blobs[2], strict=True):
            d = ((yy - cy - 0.01 * t) ** 2 + (xx - cx) ** 2) / (r * r)
            img = img + (col - img) * np.exp(-d)[..., None]
        frames.append(img)
    return np.clip(np.rint(frames), 0, 255).astype(np.uint8)


def reencode(frames: np.ndarray, crf: int = 35) -> np.ndarray:
    from gpufleet.provenance.video import decode_mp4, encode_mp4

    return decode_mp4(encode_mp4(frames, crf=crf, preset="medium"))  # the attack the robustness table was measured with


def scale(frames: np.ndarray, factor: float) -> np.ndarray:
    import cv2

    h, w = frames.shape[1:3]
    size = (max(1, round(w * factor)), max(1, round(h * factor)))
    return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])


def crop(frames: np.ndarray, share: float = 0.1) -> np.ndarray:
    h, w = frames.shape[1:3]
    dy, dx = round(h * share), round(w * share)
    top, left = dy * 2 // 3, dx // 3
    return frames[:, top : h - (dy - top), left : w - (dx - left)].copy()


def shift(frames: np.ndarray, dy: int = 4, dx: int = 4) -> np.ndarray:
    pad = np.pad(frames, ((0, 0), (dy, 0), (dx, 0), (0, 0)), mode="edge")
    return pad[:, : frames.shape[1], : frames.shape[2]].copy()


def flip(frames: np.ndarray) -> np.ndarray:
    return frames[:, :, ::-1].copy()


def jpeg_frame(frames: np.ndarray, quality: int = 50) -> np.ndarray:
    import cv2

    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(frames[len(frames) // 2][:, :, ::-1]),
                           [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[None, :, :, ::-1].copy()


TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda f: f,
    "h264_crf35": reencode,
    "scale_0.5": lambda f: scale(f, 0.5),
    "crop_10pct": crop,
    "shift_4px": shift,
    "flip_h": flip,
    "jpeg_q50_one_frame": jpeg_frame,
    "under_256px": lambda f: scale(f, 0.45),
}


def remux(mp4: bytes) -> bytes:
    """Stream-copy an MP4's video into a new MP4 (no re-encode): what strips a C2PA manifest."""
    import io

    import av

    out = io.BytesIO()
    with av.open(io.BytesIO(mp4)) as src, av.open(out, "w", format="mp4") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is None:
                continue
            packet.stream = stream
            dst.mux(packet)
    return out.getvalue()
