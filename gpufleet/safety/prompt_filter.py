"""Tier-1 safety: classify a prompt before it reaches a GPU.

Contract: ``PromptFilter(policy=None, encoder=None).check(prompt) -> PromptDecision``.
- The prompt is normalised first (:func:`gpufleet.safety.normalize.normalize`:
  NFKC, zero-width and homoglyph folding, leetspeak and letter-spacing collapse),
  then cut into clauses and overlapping word windows
  (:func:`gpufleet.safety.segments.segment`).
- Rules run first, each within one clause (deterministic, high precision); then
  scoring of every clause and window by its embedding (the policy's encoder, by
  default the multilingual USE v3). With the policy's ``logistic`` head (the
  default policy) a softmax regression fitted on the exemplars and safe anchors
  at build time gives P(safe) and P(category); a segment with
  ``1 − P(safe) >= threshold`` blocks the prompt under its most probable
  category, when its nearest exemplar of that category is at least ``min_similarity`` similar (for a prompt
  scored as several segments, ``long_min_similarity`` when set) and (with
  ``safe_margin``) more similar by that margin than its nearest safe anchor. Without it, zero-shot scoring: each category's exemplars (cosine; the
  mean of the ``top_k`` best) against the policy's safe anchors; the
  highest-scoring category that passes its threshold and the margin over that
  segment's safe anchor blocks.
- Every decision carries ``scores`` (per category, the maximum over segments,
  rounded to 4 places: probabilities with the head, similarities without), ``category`` (the blocking one, or the top-scoring one
  when allowed), ``model_hash`` (SHA-256 of the weights), ``policy_version``,
  ``reasons`` and ``segment`` (the clause or window that blocked; None when allowed).
- ``PromptFilter.default()`` is a process-wide instance (the model loads once).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.safety import fitted
from gpufleet.safety.conditions import Condition, condition
from gpufleet.safety.encoder import Encoder, encoder_for
from gpufleet.safety.evasion import TRANSFORMS
from gpufleet.safety.head import SoftmaxHead, fit_softmax
from gpufleet.safety.ngrams import SparseRows, hashed_ngrams
from gpufleet.safety.normalize import normalize
from gpufleet.safety.policy import Policy, default_policy
from gpufleet.safety.segments import Segments, segment
from gpufleet.safety.spelling import Speller, speller_for

__all__ = ["PromptDecision", "PromptFilter", "normalize"]

#: a prompt a rule blocks, in :meth:`PromptFilter.blocking_scores`: above every threshold
RULE_SCORE = 2.0


@dataclass(frozen=True)
class PromptDecision:
    allowed: bool
    category: str | None
    scores: dict[str, float]
    model_hash: str
    policy_version: str
    reasons: list[str] = field(default_factory=list)
    segment: str | None = None

    @property
    def reason(self) -> str | None:
        """One-line summary of why the prompt was blocked (None when allowed)."""
        return None if self.allowed else "; ".join(self.reasons) or f"blocked: {self.category}"

    @property
    def score(self) -> float | None:
        """The score of the decision's category (None when no category)."""
        return self.scores.get(self.category) if self.category else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "category": self.category,
            "scores": dict(self.scores),
            "model_hash": self.model_hash,
            "policy_version": self.policy_version,
            "reasons": list(self.reasons),
            "segment": self.segment,
        }


_EXEMPLAR_CACHE: dict[tuple[str, str], np.ndarray] = {}
_EXEMPLAR_LOCK = threading.Lock()


def _embed_exemplars(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """Embeddings of policy exemplars, each computed once per process and encoder (filters built again with
    another policy, or in tests, reuse them)."""
    key = getattr(encoder, "model_hash", str(id(encoder)))
    with _EXEMPLAR_LOCK:
        missing = list(dict.fromkeys(t for t in texts if (key, t) not in _EXEMPLAR_CACHE))
    if missing:
        vectors = encoder.encode(missing)
        with _EXEMPLAR_LOCK:
            for t, v in zip(missing, vectors, strict=True):
                _EXEMPLAR_CACHE[(key, t)] = v
    with _EXEMPLAR_LOCK:
        return np.stack([_EXEMPLAR_CACHE[(key, t)] for t in texts])


class PromptFilter:
    _default: PromptFilter | None = None
    _default_lock = threading.Lock()

    def __init__(
        self,
        policy: Policy | None = None,
        encoder: Encoder | None = None,
        policy_path: str | None = None,
        use_fitted: bool = True,
    ) -> None:
        """``policy_path``: where ``policy`` was loaded from (None: the packaged policy); its saved fitted state
        (:mod:`gpufleet.safety.fitted`) is used when it matches the policy and encoder exactly."""
        self.policy = policy or default_policy(policy_path)
        self.encoder = encoder or encoder_for(self.policy.encoder)
        self._cat_names = [c.name for c in self.policy.categories]
        self._thresholds = np.array([c.threshold for c in self.policy.categories])
        self._speller_instance = self._speller()
        saved = (
            fitted.load(fitted.fitted_path(policy_path), self.policy, self.encoder.model_hash) if use_fitted else None
        )
        if saved is not None:
            # the exemplar embeddings and n-gram weights are stored as float16 (half the image); used as float32
            saved = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in saved.items()}
            sizes = [len(c.exemplars) for c in self.policy.categories]
            self._cat_embeds = np.split(saved["categories"], np.cumsum(sizes)[:-1])
            self._safe = saved["safe"] if len(saved["safe"]) else None
            self._head = (
                SoftmaxHead(
                    saved["head_weights"],
                    saved["head_bias"],
                    float(saved["head_scale"]),
                    saved.get("head_ngram_weights"),
                    float(saved["head_ngram_scale"]) if "head_ngram_scale" in saved else 1.0,
                )
                if "head_weights" in saved
                else None
            )
            return
        self._cat_embeds = [
            _embed_exemplars(self.encoder, [normalize(e) for e in c.exemplars]) for c in self.policy.categories
        ]
        self._safe = (
            _embed_exemplars(self.encoder, [normalize(e) for e in self.policy.safe_exemplars])
            if self.policy.safe_exemplars
            else None
        )
        self._head = self._fit_head()

    def save_fitted(self, path: Path, policy: Policy | None = None) -> None:
        """Write this filter's exemplar embeddings and head for :mod:`gpufleet.safety.fitted`, for its policy or for
        ``policy`` (the same policy but for its thresholds: ``gpufleet safety calibrate``)."""
        arrays = {
            "categories": np.concatenate(self._cat_embeds).astype(np.float16),
            "safe": (self._safe if self._safe is not None else np.zeros((0, 1), dtype=np.float32)).astype(np.float16),
        }
        if self._head is not None:
            arrays.update(
                head_weights=self._head.weights, head_bias=self._head.bias, head_scale=np.array(self._head.scale)
            )
            if self._head.ngram_weights is not None:
                arrays.update(
                    head_ngram_weights=self._head.ngram_weights.astype(np.float16),
                    head_ngram_scale=np.array(self._head.ngram_scale),
                )
        fitted.save(path, policy or self.policy, self.encoder.model_hash, arrays)

    def _fit_head(self) -> SoftmaxHead | None:
        spec = self.policy.logistic
        if spec is None or self._safe is None:
            return None
        groups = [list(self.policy.safe_exemplars)] + [list(c.exemplars) for c in self.policy.categories]
        xs, ys = [self._safe, *self._cat_embeds], [np.full(len(g), i) for i, g in enumerate(groups)]
        texts = [normalize(e) for g in groups for e in g]
        for kind in spec.augment:
            transform = TRANSFORMS[kind]
            for i, g in enumerate(groups):
                prepared = [self._prepared(transform(e)) for e in g]
                xs.append(_embed_exemplars(self.encoder, prepared))
                ys.append(np.full(len(g), i))
                texts += prepared
        x, y = np.concatenate(xs), np.concatenate(ys)
        ng = spec.ngrams
        return fit_softmax(
            x,
            y,
            len(self._cat_embeds) + 1,
            l2=spec.l2,
            scale=spec.scale,
            iterations=spec.iterations,
            learning_rate=spec.learning_rate,
            grams=None if ng is None else hashed_ngrams(texts, ng.dims, ng.sizes),
            ngram_l2=0.0 if ng is None else ng.l2,
            ngram_scale=1.0 if ng is None else ng.scale,
        )

    def _grams(self, texts: list[str] | tuple[str, ...]) -> SparseRows | None:
        """The hashed n-grams of scored segments when the head reads them (None otherwise)."""
        spec = self.policy.logistic
        if self._head is None or self._head.ngram_weights is None or spec is None or spec.ngrams is None:
            return None
        return hashed_ngrams(texts, spec.ngrams.dims, spec.ngrams.sizes)

    @classmethod
    def default(cls, policy_path: str | None = None) -> PromptFilter:
        """The process-wide filter, built on first use with the policy at ``policy_path`` (None or empty: the
        packaged policy)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls(policy=default_policy(policy_path), policy_path=policy_path or None)
            return cls._default

    def segments(self, prompt: str) -> Segments:
        """Clauses (rules) and windows of the normalised prompt; with the policy's ``spelling`` the windows and
        clauses scored are those of the corrected text too (see :meth:`scored_segments`)."""
        return segment(normalize(prompt), self.policy.window_words, self.policy.stride_words)

    def _speller(self) -> Speller | None:
        if not self.policy.spelling:
            return None
        words = {w for text in self._policy_texts() for w in normalize(text).split() if w.isalpha()}
        if self.policy.spelling_unsafe_margin is None:
            unsafe: frozenset[str] = frozenset()
        else:
            safe = {w for text in self.policy.safe_exemplars for w in normalize(text).split()}
            unsafe = (
                frozenset(
                    w for c in self.policy.categories for e in c.exemplars for w in normalize(e).split() if w.isalpha()
                )
                - safe
            )
        return speller_for(
            tuple(self.policy.spelling),
            frozenset(words),
            unsafe_words=unsafe,
            unsafe_margin=self.policy.spelling_unsafe_margin,
            split_article=self.policy.spelling_split_article,
            english_only=self.policy.spelling_english_only,
            margin_substitutions_only=self.policy.spelling_margin_substitutions_only,
            english_candidates=self.policy.spelling_english_candidates,
        )

    def _policy_texts(self) -> list[str]:
        return list(self.policy.safe_exemplars) + [e for c in self.policy.categories for e in c.exemplars]

    def _prepared(self, text: str) -> str:
        """Normalised and, with the policy's spelling, corrected text."""
        text = normalize(text)
        return self._speller_instance.correct(text) if self._speller_instance is not None else text

    def scored_segments(self, prompt: str) -> tuple[Segments, tuple[str, ...]]:
        """(the segments rules see, the texts that are embedded and scored)."""
        sg, scored, _ = self.judged(prompt)
        return sg, scored

    def judged(self, prompt: str) -> tuple[Segments, tuple[str, ...], Condition | None]:
        """(the segments rules see, the texts that are embedded and scored, the prompt's condition:
        :func:`gpufleet.safety.conditions.condition`)."""
        text = normalize(prompt)
        sg = segment(text, self.policy.window_words, self.policy.stride_words)
        speller = self._speller_instance
        if speller is None:
            scored = sg.all()
            return sg, scored, condition(len(scored), "en", False)
        fixed_text = speller.correct(text)
        scored = segment(fixed_text, self.policy.window_words, self.policy.stride_words).all()
        return sg, scored, condition(len(scored), speller.language(text), fixed_text != text)

    def _score_matrix(
        self, vectors: np.ndarray, texts: list[str] | tuple[str, ...] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """(segments × categories scores, per-segment safe score) of the segments ``texts`` embedded as
        ``vectors``: with the logistic head the class probabilities (P(category), P(safe)); else the mean of the
        top-k exemplar similarities per category and the best safe-anchor similarity."""
        if self._head is not None:
            p = self._head.probabilities(vectors, self._grams(texts))
            return p[:, 1:], p[:, 0]
        return self._similarities(vectors)

    def _nearest(self, vectors: np.ndarray) -> np.ndarray:
        """segments × categories: the best similarity to one exemplar of the category."""
        return np.stack([(vectors @ emb.T).max(axis=1) for emb in self._cat_embeds], axis=1)

    def _similarities(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self.policy.top_k
        cols = []
        for emb in self._cat_embeds:
            sims = vectors @ emb.T
            kk = min(k, sims.shape[1])
            cols.append(np.sort(sims, axis=1)[:, -kk:].mean(axis=1))
        cats = np.stack(cols, axis=1) if cols else np.zeros((len(vectors), 0))
        safe = (vectors @ self._safe.T).max(axis=1) if self._safe is not None else np.zeros(len(vectors))
        return cats, safe

    def scores(self, prompt: str) -> tuple[dict[str, float], float]:
        """(per-category score, best safe-anchor similarity), each the maximum over the prompt's segments."""
        _, segs = self.scored_segments(prompt)
        cats, safe = self._score_matrix(self.encoder.encode(list(segs)), segs)
        return dict(zip(self._cat_names, cats.max(axis=0).tolist(), strict=True)), float(safe.max())

    def blocking_scores(self, prompts: list[str], batch_size: int = 64) -> tuple[list[Condition | None], np.ndarray]:
        """(condition, score) per prompt: the prompt is blocked iff score >= its condition's threshold — its highest
        P(unsafe) over its scored segments, above 1 when a rule matches. Only for a logistic head without similarity
        gates (``min_similarity`` <= -1, no ``long_min_similarity`` or ``safe_margin``) nor per-category thresholds,
        where the thresholds per condition alone decide; else :class:`ValueError`. What :mod:`gpufleet.safety.calibrate` chooses thresholds from."""
        spec = self.policy.logistic
        if self._head is None or spec is None:
            raise ValueError("the policy has no logistic head: it has no thresholds to calibrate")
        if spec.min_similarity > -1 or spec.long_min_similarity is not None or spec.safe_margin is not None:
            raise ValueError("the policy's head has similarity gates: its thresholds alone do not decide")
        if spec.category_thresholds:
            raise ValueError("the policy's head has thresholds per category: one per condition does not decide")
        judged = [self.judged(p) for p in prompts]
        unique = list(dict.fromkeys(s for _, scored, _ in judged for s in scored))
        index = {s: i for i, s in enumerate(unique)}
        chunks = [self.encoder.encode(unique[i : i + batch_size]) for i in range(0, len(unique), batch_size)]
        unsafe = 1.0 - self._score_matrix(np.concatenate(chunks), unique)[1] if unique else np.zeros(0)
        scores = [
            RULE_SCORE
            if any(rule.matches(c) for rule in self.policy.rules for c in sg.clauses)
            else float(unsafe[[index[s] for s in scored]].max())
            if scored
            else 0.0
            for sg, scored, _ in judged
        ]
        return [cond for _, _, cond in judged], np.array(scores)

    def check(self, prompt: str) -> PromptDecision:
        return self.check_many([prompt])[0]

    def check_many(self, prompts: list[str], batch_size: int = 64) -> list[PromptDecision]:
        """Decisions for many prompts; every distinct segment is embedded once, in batches."""
        pairs = [self.judged(p) for p in prompts]
        unique = list(dict.fromkeys(s for _, scored, _ in pairs for s in scored))
        index = {s: i for i, s in enumerate(unique)}
        vectors = [self.encoder.encode(unique[i : i + batch_size]) for i in range(0, len(unique), batch_size)]
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, 1))
        n = len(self._cat_names)
        cats, safe = self._score_matrix(matrix, unique) if len(unique) else (np.zeros((0, n)), np.zeros(0))
        head = len(unique) and self._head is not None
        nearest = self._nearest(matrix) if head else None
        near_safe = (matrix @ self._safe.T).max(axis=1) if head else None
        out = []
        for sg, scored, cond in pairs:
            rows = [index[s] for s in scored]
            out.append(
                self._decide(
                    sg,
                    scored,
                    cats[rows],
                    safe[rows],
                    None if nearest is None else nearest[rows],
                    None if near_safe is None else near_safe[rows],
                    cond,
                )
            )
        return out

    def _decide(
        self,
        sg: Segments,
        scored: tuple[str, ...],
        cats: np.ndarray,
        safe: np.ndarray,
        nearest: np.ndarray | None = None,
        near_safe: np.ndarray | None = None,
        cond: Condition | None = None,
    ) -> PromptDecision:
        names = self._cat_names
        best = cats.max(axis=0) if len(cats) else np.zeros(len(names))
        rounded = {n: round(float(x), 4) for n, x in zip(names, best, strict=True)}
        common = {"scores": rounded, "model_hash": self.encoder.model_hash, "policy_version": self.policy.version}
        for rule in self.policy.rules:
            for clause in sg.clauses:
                hit = rule.matches(clause)
                if hit:
                    return PromptDecision(
                        False,
                        rule.category,
                        reasons=[f"rule {rule.category}: matched {hit!r}"],
                        segment=clause,
                        **common,
                    )
        if self._head is not None and nearest is not None:
            return self._decide_logistic(scored, cats, safe, nearest, near_safe, common, cond)
        passing = (cats >= self._thresholds) & ((cats - safe[:, None]) > self.policy.margin)
        if passing.any():
            masked = np.where(passing, cats, -np.inf)
            seg_i, cat_i = np.unravel_index(int(np.argmax(masked)), masked.shape)
            name, x = names[cat_i], float(cats[seg_i, cat_i])
            text = scored[seg_i]
            return PromptDecision(
                False,
                name,
                reasons=[
                    f"{name}: similarity {x:.3f} >= {self._thresholds[cat_i]:.2f} (safe anchor {float(safe[seg_i]):.3f})"
                ],
                segment=text,
                **common,
            )
        top = max(rounded, key=rounded.get) if rounded else None
        return PromptDecision(True, top, reasons=[], **common)

    def _decide_logistic(
        self,
        scored: tuple[str, ...],
        cats: np.ndarray,
        safe: np.ndarray,
        nearest: np.ndarray,
        near_safe: np.ndarray | None,
        common: dict[str, Any],
        cond: Condition | None = None,
    ) -> PromptDecision:
        spec = self.policy.logistic
        assert spec is not None
        unsafe = 1.0 - safe
        best_cat = np.argmax(cats, axis=1) if len(cats) else np.zeros(0, dtype=int)
        near = nearest[np.arange(len(best_cat)), best_cat] if len(best_cat) else np.zeros(0)
        limits = np.array([spec.threshold_for(n, cond) for n in self._cat_names])
        floor = spec.min_similarity
        if spec.long_min_similarity is not None and len(scored) > 1:
            floor = spec.long_min_similarity
        passing = (unsafe >= limits[best_cat]) & (near >= floor)
        if spec.safe_margin is not None and near_safe is not None:
            passing &= near - near_safe >= spec.safe_margin
        if passing.any():
            seg_i = int(np.argmax(np.where(passing, unsafe, -np.inf)))
            cat_i = int(best_cat[seg_i])
            name = self._cat_names[cat_i]
            return PromptDecision(
                False,
                name,
                reasons=[
                    f"{name}: P(unsafe) {float(unsafe[seg_i]):.3f} >= {spec.threshold_for(name, cond):.3f}"
                    + (f" ({cond} prompt)" if cond and cond in (spec.condition_thresholds or {}) else "")
                    + " "
                    f"(P({name}) {float(cats[seg_i, cat_i]):.3f}, nearest exemplar {float(near[seg_i]):.3f}"
                    + ("" if near_safe is None else f", nearest safe anchor {float(near_safe[seg_i]):.3f}")
                    + ")"
                ],
                segment=scored[seg_i],
                **common,
            )
        scores = common["scores"]
        top = max(scores, key=scores.get) if scores else None
        return PromptDecision(True, top, reasons=[], **common)
