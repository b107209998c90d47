"""What kind of prompt the tier-1 filter is judging, for the logistic head's per-condition thresholds (pure).

Contract: :func:`condition` names the first of these that holds, or None (a plain prompt):
- ``"long"``: the prompt is scored as more than one segment (several sentences, or more than ``window_words``
  words: a request buried after a paragraph, a long description), the test ``long_min_similarity`` uses;
- ``"other_language"``: the speller finds the prompt to be in another of its languages than English
  (:meth:`gpufleet.safety.spelling.Speller.language`; without the speller's per-language lists every prompt is
  English);
- ``"corrected"``: the speller changed the prompt (a misspelt one, or letter-spaced words normalisation joined).
Observable at check time from what the filter computes anyway; the thresholds per condition are chosen by
cross-validation over the labelled sets, where each condition is mostly one evasion variant (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Literal

Condition = Literal["long", "other_language", "corrected"]


def condition(scored_segments: int, language: str, corrected: bool) -> Condition | None:
    if scored_segments > 1:
        return "long"
    if language != "en":
        return "other_language"
    if corrected:
        return "corrected"
    return None
