"""Spelling correction of single-edit misspellings before the prompt is embedded (deterministic).

Contract: :class:`Speller` knows the words of word-frequency dictionaries (the
``pyspellchecker`` wheel's en, es, fr, de and pt lists, MIT; built from subtitle
word counts) plus ``extra_words`` (the policy's own vocabulary, so domain terms
such as ``fentanyl`` are known). :meth:`Speller.correct` leaves a word alone when
it is known, shorter than ``min_length`` letters or not purely alphabetic;
otherwise it replaces it with the most frequent known word one edit away (a
deletion, an adjacent swap, a substitution or an insertion: Damerau-Levenshtein
distance 1), frequencies compared relative to each dictionary's total. With no
such candidate, a word of ``min_split`` or more letters is split into the most
probable sequence of known words (a letter-spaced phrase that normalisation
joined: ``givingapuppy`` → ``giving a puppy``), when one exists; else the word
stays. Punctuation around a word is kept. Two options (policy fields, off by
default): ``unsafe_margin`` (see :meth:`Speller.likelihood`: a safe word is not
turned into an unsafe-only one on frequency alone, ``dbeating`` → ``debating``
rather than ``beating``; with ``margin_substitutions_only`` only where the edit is a
substitution) and ``split_article`` (an unknown word that is a
one-letter word, a e i o y à, glued to a known word is split there before any
edit: ``apharmacy`` → ``a pharmacy``, not ``pharmacy``).
A third, ``english_only`` (off by default): :meth:`Speller.language` names the
language of a text (the word lists' frequencies, English preferred unless another
is ``ENGLISH_PRIOR`` nats likelier) and :meth:`Speller.correct` leaves a text in
another language as it is: the English evasion variants are what the speller is
for, and on Spanish, German or Portuguese text it only rewrites the inflections
and compounds its lists lack (``despiezando`` → the Portuguese ``desprezando``,
``mausefalle`` → ``ma use falle``). A fourth, ``english_candidates`` (off by default): an English text's
words are corrected to English words or the policy's only (``horo moie`` became the Spanish ``oro`` and the
French ``moi``).
:func:`speller_for` returns a process-wide instance per language tuple. The word lists are read
straight from the wheel's resources (:func:`word_counts`: what ``SpellChecker(language=...)`` loads, without
building one) and merged by :func:`merged_frequencies` in numpy: the same table for about a quarter less CPU
(3.5 -> 2.7 s for the five lists, measured here; the prompt filter loads it in CheckPrompt's init phase).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import math
import pkgutil
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError

_LETTERS = "abcdefghijklmnopqrstuvwxyzáàâãäçéèêëíìîïñóòôõöúùûüß"
_ONE_LETTER_WORDS = frozenset("aeioyà")
_EDGES = re.compile(r"^(\W*)(.*?)(\W*)$", re.DOTALL)


def edits1(word: str) -> set[str]:
    """Every string one deletion, adjacent swap, substitution or insertion away from ``word``."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deletes = [a + b[1:] for a, b in splits if b]
    swaps = [a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1]
    subs = [a + c + b[1:] for a, b in splits if b for c in _LETTERS]
    inserts = [a + c + b for a, b in splits for c in _LETTERS]
    return set(deletes + swaps + subs + inserts)


#: candidate weights (:meth:`Speller.likelihood`), chosen on the dev split's misspelt variant (docs/benchmarks.md)
SUBSTITUTION_WEIGHT = 0.1
DOMAIN_WEIGHT = 3.0
#: language detection (``english_only``): a word's frequency in a language counts down to this floor (rarer and
#: unknown words all count as this), and English wins unless another language is this many nats likelier; chosen
#: on the seen splits' detection errors alone (docs/benchmarks.md), not on filter scores
LANGUAGE_FLOOR = 1e-6
ENGLISH_PRIOR = 6.0


def word_counts(language: str) -> dict[str, int]:
    """``pyspellchecker``'s word list for ``language`` as its ``SpellChecker(language=...)`` holds it: the
    wheel's ``resources/<language>.json.gz``, keys lower-cased (the counts of words that differ only in case
    summed); ConfigError without the package or the list."""
    if importlib.util.find_spec("spellchecker") is None:
        raise ConfigError("spelling correction needs pyspellchecker (pip install -c constraints.txt pyspellchecker)")
    try:
        packed = pkgutil.get_data("spellchecker", f"resources/{language.lower()}.json.gz")
    except FileNotFoundError:
        packed = None
    if not packed:
        raise ConfigError(f"pyspellchecker has no word list for language {language!r}")
    counts: dict[str, int] = json.loads(gzip.decompress(packed).decode("utf-8"))
    joined = "\n".join(counts)
    if joined != joined.lower():
        lowered: Counter[str] = Counter()
        for word, n in counts.items():
            lowered[word.lower()] += n
        counts = dict(lowered)
    return counts


def merged_frequencies(lists: Iterable[dict[str, int]]) -> dict[str, float]:
    """Each word's highest relative frequency over ``lists`` (a count, positive as in the word lists, over its
    list's total). Pure: every pair goes in ascending order of frequency, so a word's last (kept) value is
    its largest."""
    words: list[str] = []
    parts = []
    for counts in lists:
        total = float(sum(counts.values())) or 1.0
        words.extend(counts)
        parts.append(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)) / total)
    if not words:
        return {}
    freqs = np.concatenate(parts)
    order = np.argsort(freqs, kind="stable")
    return dict(zip([words[i] for i in order.tolist()], freqs[order].tolist(), strict=True))


def _transposed(a: str, b: str) -> bool:
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


class Speller:
    def __init__(
        self,
        frequencies: dict[str, float],
        min_length: int = 4,
        min_split: int = 7,
        domain: frozenset[str] = frozenset(),
        substitution_weight: float = SUBSTITUTION_WEIGHT,
        domain_weight: float = DOMAIN_WEIGHT,
        unsafe: frozenset[str] = frozenset(),
        unsafe_margin: float | None = None,
        split_article: bool = False,
        english_only: bool = False,
        languages: dict[str, dict[str, float]] | None = None,
        margin_substitutions_only: bool = False,
        english_candidates: bool = False,
        english_words: frozenset[str] = frozenset(),
    ) -> None:
        """``languages``: per language the frequencies of its words down to ``LANGUAGE_FLOOR`` (for
        :meth:`language`; needed with ``english_only``)."""
        self.frequencies = frequencies
        self.min_length = min_length
        self.min_split = min_split
        self.domain = domain
        self.substitution_weight = substitution_weight
        self.domain_weight = domain_weight
        self.unsafe = unsafe
        self.unsafe_margin = unsafe_margin
        self.margin_substitutions_only = margin_substitutions_only
        self.english_candidates = english_candidates
        self.english_words = english_words
        self.split_article = split_article
        self.english_only = english_only
        self.languages = languages or {}
        self._longest = max(map(len, frequencies), default=0)

    @classmethod
    def load(
        cls,
        languages: Iterable[str],
        extra_words: Iterable[str] = (),
        min_length: int = 4,
        unsafe_words: frozenset[str] = frozenset(),
        unsafe_margin: float | None = None,
        split_article: bool = False,
        english_only: bool = False,
        margin_substitutions_only: bool = False,
        english_candidates: bool = False,
        **weights: float,
    ) -> Speller:
        lists = {lang: word_counts(lang) for lang in languages}
        freq = merged_frequencies(lists.values())
        by_language: dict[str, dict[str, float]] = {}
        english: frozenset[str] = frozenset()
        for lang, counts in lists.items():
            if english_candidates and lang == "en":
                english = frozenset(counts)
            if english_only or english_candidates:  # only the words above the floor matter to language()
                total = float(sum(counts.values())) or 1.0
                by_language[lang] = {w: n / total for w, n in counts.items() if n / total > LANGUAGE_FLOOR}
        floor = 1e-6  # the policy's own words: known, and preferred over rare dictionary words
        for w in extra_words:
            if w not in freq or freq[w] < floor:
                freq[w] = floor
        return cls(
            freq,
            min_length,
            domain=frozenset(extra_words),
            unsafe=unsafe_words,
            unsafe_margin=unsafe_margin,
            split_article=split_article,
            english_only=english_only,
            languages=by_language,
            margin_substitutions_only=margin_substitutions_only,
            english_candidates=english_candidates,
            english_words=english,
            **weights,
        )

    def language(self, text: str) -> str:
        """The language of ``text`` among the speller's lists: the one under which its words (alphabetic, edge
        punctuation stripped) are likeliest, each word's frequency counted down to ``LANGUAGE_FLOOR``, English
        given ``ENGLISH_PRIOR`` nats (a misspelt English prompt's unknown words must not make it Portuguese);
        "en" for a text without words or a speller without lists."""
        words = [w for w in (_EDGES.match(t).group(2) for t in text.split()) if w.isalpha()]  # type: ignore[union-attr]
        floor = math.log(LANGUAGE_FLOOR)
        best, best_score = "en", -math.inf
        for lang, freq in self.languages.items():
            score = sum(math.log(freq[w]) if w in freq else floor for w in words)
            score += ENGLISH_PRIOR if lang == "en" else 0.0
            if score > best_score or (score == best_score and lang == "en"):
                best, best_score = lang, score
        return best

    def correct_word(self, word: str, english: bool = False) -> str:
        """``english``: the candidates are English words or the policy's own (``english_words``, ``domain``)."""
        m = _EDGES.match(word)
        lead, core, trail = m.groups() if m else ("", word, "")
        if len(core) < self.min_length or not core.isalpha() or core in self.frequencies:
            return word
        if self.split_article and self._article_split(core):
            return lead + core[0] + " " + core[1:] + trail
        candidates = [
            c
            for c in edits1(core)
            if c in self.frequencies and (not english or c in self.english_words or c in self.domain)
        ]
        if candidates:
            return lead + max(candidates, key=lambda c: (self.likelihood(core, c), c)) + trail
        if len(core) >= self.min_split:
            parts = self.split(core)
            if parts:
                return lead + " ".join(parts) + trail
        return word

    def likelihood(self, typed: str, candidate: str) -> float:
        """How likely ``candidate`` (one edit from ``typed``) was meant: its frequency, times
        ``substitution_weight`` when the edit is a substitution (a letter dropped, doubled or two swapped are the
        commoner slips), times ``domain_weight`` when it is one of the policy's own words. With ``unsafe_margin``
        a word of the unsafe exemplars only is divided by the margin instead (with ``margin_substitutions_only``
        only when the edit is a substitution: a dropped, doubled or swapped letter keeps the domain weight)."""
        f = self.frequencies[candidate]
        substitution = len(candidate) == len(typed) and not _transposed(typed, candidate)
        if substitution:
            f *= self.substitution_weight
        if (
            self.unsafe_margin is not None
            and candidate in self.unsafe
            and (substitution or not self.margin_substitutions_only)
        ):
            f /= self.unsafe_margin
        elif candidate in self.domain:
            f *= self.domain_weight
        return f

    def _article_split(self, core: str) -> bool:
        """Whether ``core`` is a one-letter word glued to a known word (``apharmacy``: normalisation joined
        ``a p h a r m a c y``), the rest long enough to be corrected on its own."""
        rest = core[1:]
        return core[0] in _ONE_LETTER_WORDS and len(rest) >= self.min_length and rest in self.frequencies

    def split(self, word: str) -> list[str] | None:
        """The most probable split of ``word`` into two or more known words (of one letter only a, e, i, o, y,
        à; of two letters only common ones), or None."""
        n = len(word)
        best: list[tuple[float, int]] = [(0.0, 0)] + [(math.inf, 0)] * n  # (cost, start of the last word)
        for end in range(1, n + 1):
            for start in range(max(0, end - self._longest), end):
                piece = word[start:end]
                f = self.frequencies.get(piece)
                if f is None or best[start][0] == math.inf or (len(piece) == 1 and piece not in _ONE_LETTER_WORDS):
                    continue
                if len(piece) == 2 and f < 1e-4:  # only common two-letter words (of, in, to, de, la, ...)
                    continue
                cost = best[start][0] - math.log(f) + 3.0  # a price per word: prefer fewer, longer words
                if cost < best[end][0]:
                    best[end] = (cost, start)
        if best[n][0] == math.inf:
            return None
        parts, end = [], n
        while end > 0:
            start = best[end][1]
            parts.append(word[start:end])
            end = start
        parts.reverse()
        return parts if len(parts) >= 2 else None

    def correct(self, text: str) -> str:
        """Every word corrected (:meth:`correct_word`); with ``english_only`` a text in another language
        (:meth:`language`) unchanged; with ``english_candidates`` an English text's words corrected to English
        words (or the policy's) only, not to another list's (``horo moie`` -> the Spanish ``oro`` and French ``moi``)."""
        lang = self.language(text) if self.english_only or self.english_candidates else "en"
        if self.english_only and lang != "en":
            return text
        english = self.english_candidates and lang == "en"
        return " ".join(self.correct_word(w, english) for w in text.split(" "))


@functools.cache
def speller_for(languages: tuple[str, ...], extra_words: frozenset[str] = frozenset(), **options: Any) -> Speller:
    """:meth:`Speller.load` once per process for each set of arguments (``options``: its keyword arguments,
    hashable)."""
    return Speller.load(languages, extra_words, **options)
