"""Video frames ↔ MP4 with PyAV (libx264, yuv420p), and frame conversion helpers."""

from __future__ import annotations

import io
import os

import numpy as np

from gpufleet.finalize_route import delivery_size  # noqa: F401 - finalize's delivered size, re-exported

CRF = 18
#: libx264's preset for the delivered video. ``veryfast`` at the same CRF (the quality target) costs about a third of
#: ``medium``'s CPU on the short clips FinalizeLambda encodes (9 frames at 256²: 0.05 s against 0.17 s, and no
#: lookahead threads waiting on a busy machine: 0.08 s against 0.5 s wall at load 9), for files within a few per
#: cent of the size and the watermark read back whole (docs/benchmarks.md, issue 19's demo latency)
PRESET = "veryfast"


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8 (rounded, clipped)."""
    if frames.dtype == np.uint8:
        return frames
    return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)


def resize(frames: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resize uint8 RGB frames (bicubic) to ``width`` × ``height``."""
    if frames.shape[1] == height and frames.shape[2] == width:
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.BICUBIC)) for f in frames])


def encode_mp4(frames: np.ndarray, fps: int = 8, crf: int = CRF, preset: str = PRESET) -> bytes:
    """uint8 RGB frames (n, h, w, 3) → MP4 bytes (H.264 at ``crf`` with libx264's ``preset``)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = int(frames.shape[2])
        stream.height = int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": preset}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def decode_mp4(source: bytes | str | os.PathLike) -> np.ndarray:
    """MP4 bytes or path → uint8 RGB frames (n, h, w, 3)."""
    import av

    src = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    with av.open(src) as container:
        return np.stack([fr.to_ndarray(format="rgb24") for fr in container.decode(video=0)])
