"""What the tier-1 filter judges in a prompt: its clauses and overlapping word windows (pure).

Contract: :func:`segment` takes normalised text and returns :class:`Segments`:
- ``clauses``: the sentences (split after ``. ! ? ;``), a sentence longer than
  ``window`` words cut into windows of ``window`` words every ``stride`` words
  (the last window ends on the last word). Rules match within one clause, so a
  benign sentence cannot combine with another to condemn the prompt.
- ``windows``: the whole text when it has at most ``window`` words, else windows
  of ``window`` words every ``stride`` words over the whole text (they cross
  sentence boundaries, so a request split over sentences is still seen).
Every clause and window is embedded and scored on its own; the prompt's score
for a category is the maximum over them, so nothing is judged only by the start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


@dataclass(frozen=True)
class Segments:
    clauses: tuple[str, ...]
    windows: tuple[str, ...]

    def all(self) -> tuple[str, ...]:
        """Clauses and windows, each once, in order."""
        return tuple(dict.fromkeys(self.clauses + self.windows))


def windows(words: list[str], window: int, stride: int) -> list[str]:
    """Overlapping windows of ``window`` words every ``stride`` words; the last one ends on the last word."""
    if len(words) <= window:
        return [" ".join(words)] if words else []
    starts = list(range(0, len(words) - window + 1, stride))
    if starts[-1] != len(words) - window:
        starts.append(len(words) - window)
    return [" ".join(words[s : s + window]) for s in starts]


def segment(text: str, window: int = 32, stride: int = 16) -> Segments:
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(f"window {window} / stride {stride}: need 1 <= stride <= window")
    clauses: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        clauses.extend(windows(sentence.split(), window, stride))
    return Segments(tuple(dict.fromkeys(clauses)), tuple(windows(text.split(), window, stride)))
