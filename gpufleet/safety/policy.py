"""Prompt policy: categories for zero-shot scoring, safe anchors, and rules (pure data, validated).

Contract: a :class:`Policy` is loaded from JSON (``default_policy.json`` ships
with the package; ``GPUFLEET_PROMPT_POLICY`` or an explicit path overrides it).
``encoder`` names the sentence encoder its thresholds were chosen for
(:func:`gpufleet.safety.encoder.encoder_for`). The filter judges every clause
and word window of the normalised prompt (``window_words`` / ``stride_words``,
:mod:`gpufleet.safety.segments`): a category blocks a segment when its score
(the mean of the ``top_k`` best exemplar similarities) is at least its
``threshold`` and exceeds the segment's best safe-anchor similarity by more
than ``margin``. A rule blocks when, within one clause, any ``any_of`` pattern
matches or every ``all_of`` pattern matches (case-insensitive regular
expressions on normalised text). With ``logistic`` set, the exemplars and safe anchors instead fit a
multinomial logistic regression when the filter is built (deterministic: plain
gradient descent from zero) and a segment is unsafe when ``1 − P(safe)`` is at
least ``logistic.threshold`` (or its category's entry in ``logistic.category_thresholds``) and its similarity to the nearest exemplar of the
most probable unsafe class (the category) is at least ``logistic.min_similarity`` and, with
``logistic.safe_margin`` set, exceeds its similarity to the nearest safe anchor by at least that margin.
``version`` is recorded on every decision.
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.json")


class Category(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    threshold: float = Field(0.5, gt=0, le=1)
    exemplars: list[str] = Field(min_length=1)


class NgramFeatures(BaseModel):
    """Hashed character n-grams of the segment's normalised text (:mod:`gpufleet.safety.ngrams`) read by the
    head beside the embedding: lexical evidence (a drug's or a weapon's name, a slur, a misspelling of one) the
    sentence embedding blurs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dims: int = Field(2**15, ge=16, le=2**20)
    sizes: list[int] = Field(default_factory=lambda: [3, 4, 5], min_length=1)
    #: the n-gram row (unit length) is multiplied by this in the logits, as the embedding is by ``scale``
    scale: float = Field(5.0, gt=0)
    l2: float = Field(0.01, ge=0)

    @model_validator(mode="after")
    def _power_of_two(self) -> NgramFeatures:
        if self.dims & (self.dims - 1) or any(n < 1 for n in self.sizes):
            raise ValueError("ngrams.dims must be a power of two and every size at least 1")
        return self


class LogisticHead(BaseModel):
    """A multinomial logistic regression (safe + one class per category) fitted on the exemplars' embeddings
    when the filter is built: a segment is unsafe when 1 − P(safe) is at least ``threshold``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(gt=0, lt=1)
    #: the blocking segment must also be at least this similar (cosine) to one exemplar of its category, so
    #: text unlike anything the head was fitted on is not blocked for merely being unusual
    min_similarity: float = Field(0.0, ge=-1, le=1)
    #: with a value, the floor in place of ``min_similarity`` for every segment of a prompt scored as more than one
    #: segment (several sentences, or more than ``window_words`` words): one weakly similar clause of a long benign
    #: description cannot condemn the prompt (a clause of a kitchen scene, "someone drops a cleaver on the floor",
    #: nearest exemplar at cosine 0.44, reached P(unsafe) 0.996); None: ``min_similarity`` for every prompt
    long_min_similarity: float | None = Field(None, ge=-1, le=1)
    #: with a value, the blocking segment's nearest exemplar of its category must be at least this much more
    #: similar (cosine) than its nearest safe anchor, so a prompt closer to a benign prompt about the same topic
    #: (a prevention hotline, an explainer, a memorial) than to any harmful one is not blocked; None: no such test
    safe_margin: float | None = Field(None, ge=-1, le=1)
    l2: float = Field(0.01, ge=0)
    scale: float = Field(10.0, gt=0)
    iterations: int = Field(400, ge=1, le=5000)
    learning_rate: float = Field(0.5, gt=0)
    #: evasion variants (:mod:`gpufleet.safety.evasion`) of every exemplar added to the training rows, so
    #: misspelt or letter-spaced text is classified by meaning rather than by being unusual
    augment: list[Literal["misspelt", "leet", "spaced", "homoglyph"]] = Field(default_factory=list)
    #: with a value, the head also reads hashed character n-grams of each segment (None: the embedding alone)
    ngrams: NgramFeatures | None = None
    #: per category (by name) the P(unsafe) a segment whose most probable unsafe class is that category must reach,
    #: in place of ``threshold`` (a category not named keeps ``threshold``; None: ``threshold`` for all)
    category_thresholds: dict[str, float] | None = None
    #: per prompt condition (:func:`gpufleet.safety.conditions.condition`: long, other_language, corrected) the
    #: P(unsafe) its segments must reach, in place of ``threshold`` and ``category_thresholds``: the head is surer of a plain
    #: English prompt than of one the speller rewrote, so each kind of prompt gets the lowest threshold that keeps
    #: its false positives in budget (chosen by cross-validation, docs/benchmarks.md); a condition not named, or
    #: None, keeps the others
    condition_thresholds: dict[Literal["long", "other_language", "corrected"], float] | None = None

    @model_validator(mode="after")
    def _category_thresholds(self) -> LogisticHead:
        if any(not 0 < t < 1 for t in (self.category_thresholds or {}).values()):
            raise ValueError("logistic.category_thresholds must lie in (0, 1)")
        if any(not 0 < t < 1 for t in (self.condition_thresholds or {}).values()):
            raise ValueError("logistic.condition_thresholds must lie in (0, 1)")
        return self

    def threshold_for(self, category: str, condition: str | None = None) -> float:
        """The P(unsafe) a segment of a prompt in ``condition`` (None: plain) whose most probable unsafe class is
        ``category`` must reach."""
        by_condition: dict[str, float] = dict(self.condition_thresholds or {})
        if condition in by_condition:
            return by_condition[condition]
        return (self.category_thresholds or {}).get(category, self.threshold)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str
    any_of: list[str] = Field(default_factory=list)
    all_of: list[str] = Field(default_factory=list)
    #: all_of matches must start within this many words of each other (None: anywhere in the clause)
    within_words: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _patterns(self) -> Rule:
        if not self.any_of and not self.all_of:
            raise ValueError("a rule needs any_of or all_of patterns")
        for p in self.any_of + self.all_of:
            try:
                re.compile(p)
            except re.error as err:
                raise ValueError(f"invalid pattern {p!r}: {err}")
        return self

    def matches(self, text: str) -> str | None:
        for p in self.any_of:
            m = re.search(p, text, re.IGNORECASE)
            if m:
                return m.group(0)
        if self.all_of:
            found = [list(re.finditer(p, text, re.IGNORECASE)) for p in self.all_of]
            if not all(found):
                return None
            if self.within_words is None:
                return " + ".join(ms[0].group(0) for ms in found)
            return _near(text, found, self.within_words)
        return None


def _near(text: str, found: list[list[re.Match[str]]], within: int) -> str | None:
    """The first combination (anchored on a match of the first pattern) whose matches all start within
    ``within`` words of it, joined with ' + '; None when there is none."""

    def word_at(m: re.Match[str]) -> int:
        return len(text[: m.start()].split())

    for anchor in found[0]:
        a = word_at(anchor)
        picked = [anchor]
        for ms in found[1:]:
            near = next((m for m in ms if abs(word_at(m) - a) <= within), None)
            if near is None:
                break
            picked.append(near)
        else:
            return " + ".join(m.group(0) for m in picked)
    return None


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    version: str = Field(min_length=1)
    encoder: Literal["minilm", "use-multilingual-v3", "use-multilingual-v3-tuned"] = "minilm"
    margin: float = 0.0
    top_k: int = Field(1, ge=1, le=10)
    #: None: nearest-exemplar scoring (per-category threshold and margin); else the fitted logistic head
    logistic: LogisticHead | None = None
    #: languages of the word lists single-edit misspellings are corrected with (empty: no correction)
    spelling: list[Literal["en", "es", "fr", "de", "pt"]] = Field(default_factory=list)
    #: None: as before; m >= 1: the speller does not give a word of the unsafe exemplars only (absent from the
    #: safe ones) the domain weight and picks it over another candidate only when m times likelier
    spelling_unsafe_margin: float | None = Field(None, ge=1.0)
    #: with ``spelling_unsafe_margin``: the margin applies only when the edit to the unsafe-only word is a
    #: substitution (a dropped, doubled or swapped letter keeps the domain weight)
    spelling_margin_substitutions_only: bool = False
    #: the speller splits an unknown word that is a one-letter word glued to a known one (``apharmacy`` from
    #: ``a p h a r m a c y``) into the two words
    spelling_split_article: bool = False
    #: the speller leaves a prompt it finds to be in another of its languages than English as it is (its lists
    #: lack many Spanish, German and Portuguese inflections and compounds, which it rewrote into other words)
    spelling_english_only: bool = False
    #: the speller corrects the words of a prompt it finds to be English to English words (or the policy's) only,
    #: not to another list's (``horo`` -> the Spanish ``oro``)
    spelling_english_candidates: bool = False
    window_words: int = Field(32, ge=4, le=256)
    stride_words: int = Field(16, ge=1, le=256)
    safe_exemplars: list[str] = Field(default_factory=list)
    categories: list[Category] = Field(min_length=1)
    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rule_categories(self) -> Policy:
        if self.stride_words > self.window_words:
            raise ValueError("stride_words must not exceed window_words")
        if self.logistic is not None and not self.safe_exemplars:
            raise ValueError("a logistic head needs safe_exemplars (the safe class)")
        names = {c.name for c in self.categories}
        unknown = set((self.logistic.category_thresholds or {}) if self.logistic else ()) - names
        if unknown:
            raise ValueError(f"logistic.category_thresholds names unknown categories {sorted(unknown)}")
        for r in self.rules:
            if r.category not in names:
                raise ValueError(f"rule names unknown category {r.category!r}")
        return self

    @classmethod
    def load(cls, path: str | os.PathLike) -> Policy:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))


def default_policy(path: str | os.PathLike | None = None) -> Policy:
    """The policy at ``path`` (the deployment setting ``GPUFLEET_PROMPT_POLICY``, passed by the caller), or
    the packaged one when None or empty."""
    return Policy.load(path or DEFAULT_POLICY_PATH)
