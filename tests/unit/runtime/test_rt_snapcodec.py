"""The pickle-free snapshot layout: exact round trips, safetensors compatibility, rejection of bad input."""

from __future__ import annotations

import io
import math

import pytest
import torch
from safetensors.torch import load as st_load

from gpufleet.runtime import denoise, snapcodec


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return type(b) is float and math.isnan(b)
    if isinstance(a, float):
        return type(b) is float and a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


TREE = {
    "f32": torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1)),
    "bf16": torch.randn(5, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16),
    "f16": torch.tensor([1.5, -2.25], dtype=torch.float16),
    "f64": torch.tensor([1 / 3], dtype=torch.float64),
    "i64": torch.arange(7),
    "u8": torch.tensor([0, 255], dtype=torch.uint8),
    "bool": torch.tensor([True, False]),
    "scalar": torch.tensor(0.1),
    "empty": torch.zeros(0, 3),
    "transposed": torch.arange(12.0).view(3, 4).t(),
    "floats": [0.1, -0.0, float("inf"), float("-inf"), float("nan"), 1e-310, 2.0 ** 70],
    "ints": [0, -1, 2 ** 80, True, False],
    "none": None,
    "str": "ünïcode \"quoted\"",
    "nested": {"tuple": (1, (torch.ones(2), None)), "list": [[], {}], "t": "not a tag"},
}


def test_every_supported_value_round_trips_exactly():
    data = snapcodec.encode(TREE)
    assert snapcodec.is_encoded(data)
    back = snapcodec.decode(data)
    assert _same(TREE, back)
    assert back["transposed"].is_contiguous() and torch.equal(back["transposed"], TREE["transposed"])


def test_the_layout_is_a_safetensors_file():
    tensors = st_load(snapcodec.encode({"a": torch.arange(6).view(2, 3), "b": [torch.ones(2, dtype=torch.bfloat16)]}))
    assert sorted(tensors) == ["t0", "t1"]
    assert torch.equal(tensors["t0"], torch.arange(6).view(2, 3)) and tensors["t1"].dtype == torch.bfloat16


@pytest.mark.parametrize("bad", [{1: "int key"}, {"set": {1, 2}}, {"np": __import__("numpy").float64(1.0)},
                                 {"dtype": torch.float32}, {"c": torch.ones(2, dtype=torch.complex64)}])
def test_values_it_cannot_represent_exactly_are_refused(bad):
    with pytest.raises(snapcodec.Unsupported):
        snapcodec.encode(bad)


def test_garbage_truncation_and_tampering_are_value_errors():
    data = snapcodec.encode(TREE)
    for bad in (b"", b"PK\x03\x04 a zip", data[: len(data) - 3], data[:8] + b"[" + data[9:], b"\xff" * 64):
        with pytest.raises(ValueError):
            snapcodec.decode(bad)
    n = int.from_bytes(data[:8], "little")
    tampered = data[:8] + data[8:8 + n].replace(b'"t0"', b'"zz"', 1) + data[8 + n:]
    with pytest.raises(ValueError):
        snapcodec.decode(tampered)


def test_denoise_serialize_uses_the_fast_layout_and_falls_back_to_torch_save():
    snap = {"version": denoise.SNAPSHOT_VERSION, "latents": torch.ones(2), "scheduler": {"s": torch.zeros(1)}}
    fast = denoise.serialize(snap)
    assert snapcodec.is_encoded(fast) and _same(denoise.deserialize(fast), snap)
    odd = {**snap, "scheduler": {"sigmas": torch.zeros(1), "device": torch.device("cpu")}}
    slow = denoise.serialize(odd)
    assert slow[:2] == b"PK" and not snapcodec.is_encoded(slow)
    assert denoise.deserialize(slow)["scheduler"]["device"] == torch.device("cpu")
    legacy = io.BytesIO()
    torch.save(snap, legacy)  # checkpoints written before the fast layout still load
    assert _same(denoise.deserialize(legacy.getvalue()), snap)
    with pytest.raises(ValueError):
        denoise.deserialize(snapcodec.encode({"version": 999}))
