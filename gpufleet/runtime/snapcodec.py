"""A fast, pickle-free encoding of a denoising snapshot, in the safetensors file layout.

Contract:
- :func:`encode` turns a tree of dicts (``str`` keys), lists, tuples, ``None``,
  ``bool``/``int``/``float``/``str`` and CPU ``torch.Tensor`` leaves into bytes
  laid out as a safetensors file: 8-byte little-endian header length, a JSON
  header naming each tensor (dtype, shape, byte range), then the raw tensor
  bytes. The tree itself (with ``{"t": name}`` in place of each tensor) is the
  header's ``__metadata__["gpufleet.tree"]``, a JSON string; floats round-trip
  exactly (``repr``). Anything else raises :class:`Unsupported` (the caller may
  fall back to another format). It costs tens of microseconds for a small
  snapshot (no pickler, no zip archive), so it can run on the compute thread.
- :func:`decode` is its inverse and raises ``ValueError`` for anything that is
  not such a file (the tensors are parsed and bounds-checked by the
  ``safetensors`` library; nothing is unpickled). Tensors come back on the CPU.
- :func:`is_encoded` tells this layout from a ``torch.save`` zip archive.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

TREE_KEY = "gpufleet.tree"
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
_SCALARS = (bool, int, float, str)
_MAX_HEADER = 100 << 20


class Unsupported(TypeError):
    """The tree holds a value this encoding cannot represent exactly."""


def _tree(v: Any, tensors: list[torch.Tensor]) -> Any:
    t = type(v)
    if v is None or t in _SCALARS:
        return v
    if t is torch.Tensor:
        if v.dtype not in _DTYPES:
            raise Unsupported(f"tensor dtype {v.dtype}")
        tensors.append(v)
        return {"t": f"t{len(tensors) - 1}"}
    if t is list:
        return [_tree(x, tensors) for x in v]
    if t is tuple:
        return {"u": [_tree(x, tensors) for x in v]}
    if t is dict:
        if not all(type(k) is str for k in v):
            raise Unsupported("dict with non-str keys")
        return {"d": {k: _tree(x, tensors) for k, x in v.items()}}
    raise Unsupported(f"value of type {t.__name__}")


def _raw(t: torch.Tensor):
    """The tensor's bytes as a buffer (no copy for a contiguous CPU tensor)."""
    if t.requires_grad or t.device.type != "cpu" or not t.is_contiguous():
        t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; the bytes are the same
        t = t.view(torch.int16)
    return t.numpy()


def encode(tree: Any) -> bytes:
    tensors: list[torch.Tensor] = []
    meta = json.dumps(_tree(tree, tensors), separators=(",", ":"))
    header: dict[str, Any] = {"__metadata__": {TREE_KEY: meta}}
    blobs, offset = [], 0
    for i, t in enumerate(tensors):
        raw = _raw(t)
        header[f"t{i}"] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return b"".join([struct.pack("<Q", len(head)), head, *blobs])


def is_encoded(data: bytes) -> bool:
    if len(data) < 10:
        return False
    (n,) = struct.unpack("<Q", data[:8])
    return 2 <= n <= min(_MAX_HEADER, len(data) - 8) and data[8:9] == b"{"


def _untree(v: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(v, list):
        return [_untree(x, tensors) for x in v]
    if isinstance(v, dict):
        if len(v) != 1:
            raise ValueError("malformed snapshot tree")
        (tag, body), = v.items()
        if tag == "t":
            return tensors[body]
        if tag == "u":
            return tuple(_untree(x, tensors) for x in body)
        if tag == "d":
            return {k: _untree(x, tensors) for k, x in body.items()}
        raise ValueError(f"unknown tag {tag!r} in snapshot tree")
    return v


def decode(data: bytes) -> Any:
    from safetensors.torch import load

    if not is_encoded(data):
        raise ValueError("not a safetensors snapshot")
    try:
        (n,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8:8 + n])["__metadata__"][TREE_KEY]
        tensors = load(bytes(data))
        return _untree(json.loads(meta), tensors)
    except ValueError:
        raise
    except Exception as err:  # safetensors raises its own error type; a missing key is a KeyError
        raise ValueError(f"not a loadable snapshot: {err}") from err
