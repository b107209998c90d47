"""Near-duplicate scan between labelled prompt sets (pure, deterministic): is a held-out row a copy or a light
paraphrase of a row the policy learned from?

Contract: :func:`char_grams` is the set of character 4-grams of a prompt's lower-cased words joined by single
spaces; :func:`jaccard` their overlap; :func:`nearest` returns, for each prompt of ``rows``, the most similar
prompt of ``others`` and their Jaccard similarity (``Match``), most similar first (:class:`GramIndex` builds the
others' index once for many queries, each against all of it or a subset). Identical prompts score 1.0;
"a dog show with poodles on a stage" against "a dachshund race at a county fair" scores near 0. The embedding
scan (the filter's encoder) is in ``benchmarks/prompt_overlap.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Match:
    prompt: str
    nearest: str
    similarity: float


def char_grams(text: str, n: int = 4) -> frozenset[str]:
    s = " ".join(_WORD.findall(text.lower()))
    return frozenset(s[i : i + n] for i in range(max(len(s) - n + 1, 1)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class GramIndex:
    """An inverted index of the character 4-grams of ``pool`` (each distinct prompt once, in first-seen order), built
    once and queried many times: :meth:`nearest` is :func:`nearest` against the pool, or against the entries that
    ``allowed`` (one flag per ``pool`` entry) keeps."""

    def __init__(self, pool: Iterable[str]) -> None:
        self.pool = list(dict.fromkeys(pool))
        grams = [char_grams(o) for o in self.pool]
        self._sizes = np.array([len(g) for g in grams], dtype=np.float64)
        postings: dict[str, list[int]] = {}
        for j, g in enumerate(grams):
            for x in g:
                postings.setdefault(x, []).append(j)
        self._index = {x: np.array(js) for x, js in postings.items()}

    def nearest(self, rows: Iterable[str], allowed: np.ndarray | None = None) -> list[Match]:
        rows = list(rows)
        if not self.pool or (allowed is not None and not allowed.any()):
            return [Match(r, "", 0.0) for r in rows]
        out = []
        empty = np.zeros(0, dtype=int)
        for r in rows:
            g = char_grams(r)
            hits = [self._index[x] for x in g if x in self._index]
            inter = np.bincount(np.concatenate(hits) if hits else empty, minlength=len(self.pool))
            sim = inter / np.maximum(len(g) + self._sizes - inter, 1.0)
            if allowed is not None:
                sim = np.where(allowed, sim, -1.0)
            j = int(sim.argmax())
            out.append(Match(r, self.pool[j], round(float(sim[j]), 4)))
        return sorted(out, key=lambda m: -m.similarity)


def nearest(rows: Iterable[str], others: Iterable[str]) -> list[Match]:
    """Each prompt of ``rows`` with its most similar prompt of ``others`` (character 4-gram Jaccard), most
    similar first; intersections counted through an inverted index of the others' grams (:class:`GramIndex`)."""
    return GramIndex(others).nearest(rows)
