"""Tier-1 safety: classify a prompt before it reaches a GPU.

Contract: ``PromptFilter(policy=None, encoder=None).check(prompt) -> PromptDecision``.
- Rules run first (deterministic, high precision); then zero-shot scoring:
  the prompt's MiniLM embedding against each category's exemplars (cosine;
  the category score is the best exemplar) and against the policy's safe
  anchors. The highest-scoring category that passes its threshold and margin
  blocks the prompt.
- Every decision carries ``scores`` (per category, rounded to 4 places),
  ``category`` (the blocking one, or the top-scoring one when allowed),
  ``model_hash`` (SHA-256 of the weights), ``policy_version`` and ``reasons``.
- ``PromptFilter.default()`` is a process-wide instance (the model loads once).
"""

from __future__ import annotations

import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.safety.encoder import MiniLMEncoder
from gpufleet.safety.policy import Policy, default_policy


@dataclass(frozen=True)
class PromptDecision:
    allowed: bool
    category: str | None
    scores: dict[str, float]
    model_hash: str
    policy_version: str
    reasons: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str | None:
        """One-line summary of why the prompt was blocked (None when allowed)."""
        return None if self.allowed else "; ".join(self.reasons) or f"blocked: {self.category}"

    def as_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "category": self.category, "scores": dict(self.scores),
                "model_hash": self.model_hash, "policy_version": self.policy_version, "reasons": list(self.reasons)}


def normalize(text: str) -> str:
    """NFKC, lower-case, collapsed whitespace (defeats trivial spacing/width tricks)."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


class PromptFilter:
    _default: PromptFilter | None = None
    _default_lock = threading.Lock()

    def __init__(self, policy: Policy | None = None, encoder: MiniLMEncoder | None = None) -> None:
        self.policy = policy or default_policy()
        self.encoder = encoder or MiniLMEncoder()
        self._cat_names = [c.name for c in self.policy.categories]
        self._cat_embeds = [self.encoder.encode(c.exemplars) for c in self.policy.categories]
        self._safe = self.encoder.encode(self.policy.safe_exemplars) if self.policy.safe_exemplars else None

    @classmethod
    def default(cls, policy_path: str | None = None) -> PromptFilter:
        """The process-wide filter, built on first use with the policy at ``policy_path`` (None or empty: the
        packaged policy)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls(policy=default_policy(policy_path))
            return cls._default

    def _scores_for(self, v: np.ndarray) -> tuple[dict[str, float], float]:
        scores = {name: float(np.max(emb @ v)) for name, emb in zip(self._cat_names, self._cat_embeds, strict=True)}
        safe = float(np.max(self._safe @ v)) if self._safe is not None else 0.0
        return scores, safe

    def scores(self, prompt: str) -> tuple[dict[str, float], float]:
        """(per-category similarity, best safe-anchor similarity) for one prompt."""
        return self._scores_for(self.encoder.encode([normalize(prompt)])[0])

    def check(self, prompt: str) -> PromptDecision:
        text = normalize(prompt)
        return self._decide(text, self.encoder.encode([text])[0])

    def check_many(self, prompts: list[str], batch_size: int = 32) -> list[PromptDecision]:
        """Same decisions as :meth:`check`, embedding the prompts in batches (evaluation, backfills)."""
        texts = [normalize(p) for p in prompts]
        out: list[PromptDecision] = []
        for i in range(0, len(texts), batch_size):
            chunk = texts[i : i + batch_size]
            vectors = self.encoder.encode(chunk)
            out.extend(self._decide(t, v) for t, v in zip(chunk, vectors, strict=True))
        return out

    def _decide(self, text: str, v: np.ndarray) -> PromptDecision:
        scores, safe = self._scores_for(v)
        rounded = {k: round(x, 4) for k, x in scores.items()}
        common = {"scores": rounded, "model_hash": self.encoder.model_hash, "policy_version": self.policy.version}
        for rule in self.policy.rules:
            hit = rule.matches(text)
            if hit:
                return PromptDecision(False, rule.category, reasons=[f"rule {rule.category}: matched {hit!r}"],
                                      **common)
        blocking = [
            (x, name) for name, x in scores.items()
            if x >= self._threshold(name) and x - safe > self.policy.margin
        ]
        if blocking:
            x, name = max(blocking)
            return PromptDecision(False, name, reasons=[
                f"{name}: similarity {x:.3f} >= {self._threshold(name):.2f} (safe anchor {safe:.3f})"], **common)
        top = max(scores, key=scores.get) if scores else None
        return PromptDecision(True, top, reasons=[], **common)

    def _threshold(self, name: str) -> float:
        return next(c.threshold for c in self.policy.categories if c.name == name)
