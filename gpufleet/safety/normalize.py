"""Prompt text normalisation before any matching (pure functions).

Contract: :func:`normalize` is what the tier-1 filter matches and embeds; it is
idempotent (``normalize(normalize(t)) == normalize(t)``) and leaves plain
lower-case ASCII prose (words of two or more letters, single spaces, no letter
tripled) unchanged. The steps, in order:

1. :func:`unicode_fold`: NFKC (full-width, ligatures, compatibility forms) and
   case folding; stray combining marks (ones NFC cannot compose onto their base
   letter, e.g. ``p̈``) are dropped, composed accents (``é``) are kept.
2. :func:`strip_invisible`: zero-width and other format characters (Unicode
   category Cf: ZWSP, ZWNJ, ZWJ, word joiner, BOM, soft hyphen, bidi controls)
   are removed; every other separator becomes a plain space.
3. :func:`fold_homoglyphs`: Cyrillic and Greek look-alikes of Latin letters
   (``а е о р с х у і к м н т в``, ``α ο ρ ν τ κ``...) become the Latin letter
   in words that mix them with Latin letters or consist only of look-alikes, so
   genuine Cyrillic or Greek words are left alone.
4. :func:`collapse_spacing`: three or more single characters separated by one
   space, dot, dash, underscore or asterisk (``p o r n``, ``s.e.x``) are joined.
5. :func:`unleet`: inside a word that has letters, ``0 1 3 4 5 7 @ $ ! |``
   become ``o i e a s t a s i l``; numbers with a unit or suffix (``12yo``,
   ``4k``, ``1080p``, ``3rd``) and words with a digit leetspeak does not use
   (``h264``, ``covid19``) are left as they are.
6. :func:`collapse_repeats`: a letter repeated three or more times becomes one
   (``seeeex`` → ``sex``).
7. Whitespace collapsed to single spaces, stripped.
"""

from __future__ import annotations

import re
import unicodedata

_HOMOGLYPHS = {
    # Cyrillic
    "а": "a",
    "в": "b",
    "е": "e",
    "ё": "e",
    "к": "k",
    "м": "m",
    "н": "h",
    "о": "o",
    "р": "p",
    "с": "c",
    "т": "t",
    "у": "y",
    "х": "x",
    "і": "i",
    "ї": "i",
    "ј": "j",
    "ѕ": "s",
    "ԁ": "d",
    "ԛ": "q",
    "ԝ": "w",
    "ɡ": "g",
    "һ": "h",
    "ӏ": "l",
    "п": "n",
    "г": "r",
    "ь": "b",
    "ѵ": "v",
    "з": "3",
    # Greek
    "α": "a",
    "β": "b",
    "ε": "e",
    "η": "n",
    "ι": "i",
    "κ": "k",
    "ν": "v",
    "ο": "o",
    "ρ": "p",
    "τ": "t",
    "υ": "u",
    "χ": "x",
    "γ": "y",
    "ω": "w",
    "μ": "u",
    "ς": "c",
    "σ": "o",
    "ϲ": "c",
    "ϳ": "j",
}
_LATIN = re.compile(r"[a-z]")
_LEET = {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i", "|": "l"}
_LEET_CHARS = "".join(_LEET)
_WORD = re.compile(r"\S+")
#: a number with a short suffix or unit (12yo, 4k, 1080p, 3rd, 35mm), or any word with a digit leetspeak
#: does not use (h264, covid19, r2d2)
_KEEP_NUMERIC = re.compile(r"^(\d+[a-z]{0,3}|.*[2689].*)$")
#: three or more single characters, each separated by the same one-character separator
_SPACED = re.compile(
    r"(?<![^\W_])(?:[^\W_]|[@$!|])(?P<sep>[ ._*\-])(?:[^\W_]|[@$!|])(?:(?P=sep)(?:[^\W_]|[@$!|]))+(?![^\W_])"
)
_REPEAT = re.compile(r"([^\W\d_])\1{2,}")
_EDGE_PUNCT = re.compile(r"^([\"'(\[{<«¿¡]*)(.*?)([\"')\]}>».,;:?!]*)$", re.DOTALL)


def unicode_fold(text: str) -> str:
    """NFKC + case folding, with combining marks that do not compose onto a letter removed."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    if not any(unicodedata.combining(ch) for ch in folded):
        return folded
    return "".join(ch for ch in folded if not unicodedata.combining(ch))


def strip_invisible(text: str) -> str:
    """Drop format characters (zero-width, soft hyphen, bidi controls); other spaces become ' '."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Cf":
            continue
        out.append(" " if (ch.isspace() or cat in ("Zs", "Zl", "Zp", "Cc")) else ch)
    return "".join(out)


def _fold_word(word: str) -> str:
    confusable = [ch in _HOMOGLYPHS for ch in word]
    if not any(confusable):
        return word
    letters = [ch for ch in word if ch.isalpha()]
    only_lookalikes = all(ch in _HOMOGLYPHS for ch in letters)
    if _LATIN.search(word) or only_lookalikes:
        return "".join(_HOMOGLYPHS.get(ch, ch) for ch in word)
    return word


def fold_homoglyphs(text: str) -> str:
    """Cyrillic/Greek look-alikes to Latin, in mixed-script or look-alike-only words."""
    return _WORD.sub(lambda m: _fold_word(m.group(0)), text)


def collapse_spacing(text: str) -> str:
    """``p o r n`` / ``s.e.x`` / ``k-i-l-l`` → ``porn`` / ``sex`` / ``kill``."""
    return _SPACED.sub(lambda m: re.sub(r"[ ._*\-]", "", m.group(0)), text)


def _unleet_core(core: str) -> str:
    if not any(ch in _LEET for ch in core) or not any(ch.isalpha() for ch in core):
        return core
    if _KEEP_NUMERIC.match(core):
        return core
    return "".join(_LEET.get(ch, ch) for ch in core)


def _unleet_word(word: str) -> str:
    m = _EDGE_PUNCT.match(word)  # quotes, brackets and sentence punctuation around the word stay as they are
    lead, core, trail = m.groups() if m else ("", word, "")
    return lead + _unleet_core(core) + trail


def unleet(text: str) -> str:
    """Leetspeak digits and symbols inside words to letters (``s3x``, ``p0rn``, ``k!ll``, ``@ss``)."""
    return _WORD.sub(lambda m: _unleet_word(m.group(0)), text)


def collapse_repeats(text: str) -> str:
    """A letter repeated three or more times becomes one."""
    return _REPEAT.sub(r"\1", text)


def _once(text: str) -> str:
    text = strip_invisible(unicode_fold(text))
    text = fold_homoglyphs(text)
    text = collapse_spacing(text)
    text = unleet(text)
    text = collapse_repeats(text)
    return " ".join(text.split())


def normalize(text: str) -> str:
    """The text the tier-1 filter matches and embeds (see the module docstring); idempotent."""
    out = _once(text)
    for _ in range(3):  # each step is idempotent on its own; their order can expose one more (rare) fold
        again = _once(out)
        if again == out:
            break
        out = again
    return out
