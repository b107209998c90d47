"""Thresholds per prompt condition for the tier-1 logistic head, chosen on labelled prompts (pure).

Contract: :func:`condition_thresholds` takes, for every labelled prompt, its blocking score (the P(unsafe) at which
the filter would block it: :meth:`gpufleet.safety.PromptFilter.blocking_scores`, a rule's hit scoring above any
threshold), whether it is unsafe, its group (a set type: English, a variant, a language) and the index of its
condition (:mod:`gpufleet.safety.conditions`, in the order of ``conditions``). From the single threshold at which
every group's false-positive rate on the rows in ``mask`` is within ``max_fpr``, each condition's threshold is lowered
in turn to the lowest value that keeps every group within the budget — four rounds over the conditions (coordinate
descent). A prompt is blocked iff its score >= its condition's threshold. The thresholds are candidate scores
rounded to 4 places (1.0 when no score keeps the budget), so the result is deterministic.

This is how ``benchmarks/prompt_filter_cv.py`` chooses a policy's thresholds on out-of-fold scores,
``benchmarks/prompt_filter_refit.py`` on seen held-out splits, and ``gpufleet safety calibrate`` on an operator's
own labelled prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUNDS = 4
#: the prompt conditions (:func:`gpufleet.safety.conditions.condition`) and "plain" (None there), in index order
CONDITIONS = ("long", "other_language", "corrected", "plain")


def condition_thresholds(
    score: np.ndarray,
    unsafe: np.ndarray,
    group: np.ndarray,
    cond: np.ndarray,
    conditions: Sequence[str],
    mask: np.ndarray,
    max_fpr: float,
    groups: Sequence[str] | None = None,
    fixed: dict[str, float] | None = None,
) -> dict[str, float]:
    """A threshold per condition (see the module docstring). ``groups``: the group names whose FPR is held within
    the budget (None: every group present); rows of other groups only count through their scores. ``fixed``:
    conditions whose thresholds are given (too few labelled prompts to choose them): their prompts count in every
    group's FPR at those thresholds, and only the other conditions are chosen."""
    fixed = dict(fixed or {})
    free = [c for c in conditions if c not in fixed]
    score, unsafe, group, cond, mask = map(np.asarray, (score, unsafe, group, cond, mask))
    cands = np.unique(np.round(score, 4))
    names = list(dict.fromkeys(group.tolist())) if groups is None else list(groups)
    safe_rows = [mask & (group == g) & ~unsafe for g in names]
    safe_rows = [g for g in safe_rows if g.any()]

    def within(th: dict[str, float]) -> bool:
        blocked = score >= np.array([th[c] for c in conditions])[cond]
        return all(blocked[g].mean() <= max_fpr for g in safe_rows)

    start = next((float(c) for c in cands if within({**dict.fromkeys(free, float(c)), **fixed})), 1.0)
    th = {**dict.fromkeys(free, start), **fixed}
    for _ in range(ROUNDS):
        for c in free:
            for lower in cands[cands < th[c]][::-1]:
                if not within({**th, c: float(lower)}):
                    break
                th[c] = float(lower)
    return {c: th[c] for c in conditions}


def blocked(score: np.ndarray, cond: np.ndarray, conditions: Sequence[str], th: dict[str, float]) -> np.ndarray:
    """Which prompts those thresholds block."""
    return np.asarray(score) >= np.array([th[c] for c in conditions])[np.asarray(cond)]
