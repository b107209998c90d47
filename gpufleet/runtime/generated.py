"""The persisted inference output of the ``generate`` stage (numpy only: the finalize stage reads it
without importing torch).

Contract: :func:`pack_output` writes frames (uint8 array) and a JSON ``meta`` dict as one ``.npz``
(no pickles); :func:`unpack_output` is its inverse and refuses pickled content.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np


def pack_output(frames: np.ndarray, meta: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, frames=frames, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8))
    return buf.getvalue()


def unpack_output(data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return z["frames"], json.loads(z["meta"].tobytes().decode())
