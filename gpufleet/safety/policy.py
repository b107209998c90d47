"""Prompt policy: categories for zero-shot scoring, safe anchors, and rules (pure data, validated).

Contract: a :class:`Policy` is loaded from JSON (``default_policy.json`` ships
with the package; ``GPUFLEET_PROMPT_POLICY`` or an explicit path overrides it).
A category blocks a prompt when its best exemplar similarity is at least its
``threshold`` and exceeds the best safe-anchor similarity by more than
``margin``. A rule blocks when any ``any_of`` pattern matches, or when every
``all_of`` pattern matches (case-insensitive regular expressions).
``version`` is recorded on every decision.
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.json")


class Category(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    threshold: float = Field(gt=0, le=1)
    exemplars: list[str] = Field(min_length=1)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str
    any_of: list[str] = Field(default_factory=list)
    all_of: list[str] = Field(default_factory=list)

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
            found = [re.search(p, text, re.IGNORECASE) for p in self.all_of]
            if all(found):
                return " + ".join(m.group(0) for m in found if m)
        return None


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached_property,))

    version: str = Field(min_length=1)
    margin: float = 0.0
    safe_exemplars: list[str] = Field(default_factory=list)
    categories: list[Category] = Field(min_length=1)
    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rule_categories(self) -> Policy:
        names = {c.name for c in self.categories}
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
