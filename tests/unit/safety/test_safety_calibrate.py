"""Thresholds per prompt condition chosen on labelled scores (:mod:`gpufleet.safety.calibrate`, pure): every group
keeps its false-positive rate within the budget, conditions with given thresholds keep them, and the choice is the
lowest each condition can take."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.safety.calibrate import blocked, condition_thresholds

CONDITIONS = ("long", "plain")


@st.composite
def labelled(draw):
    n = draw(st.integers(2, 60))
    score = np.array(draw(st.lists(st.integers(0, 99), min_size=n, max_size=n))) / 100
    unsafe = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    group = np.array(draw(st.lists(st.sampled_from(["en", "es"]), min_size=n, max_size=n)))
    cond = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    return score, unsafe, group, cond, draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))


@settings(max_examples=150, deadline=None)
@given(labelled())
def test_every_group_keeps_its_false_positive_rate_within_the_budget(data):
    score, unsafe, group, cond, budget = data
    th = condition_thresholds(score, unsafe, group, cond, CONDITIONS, np.ones(len(score), bool), budget)
    b = blocked(score, cond, CONDITIONS, th)
    for g in ("en", "es"):
        safe = ~unsafe & (group == g)
        if safe.any():
            assert b[safe].mean() <= budget, (g, th)


@settings(max_examples=100, deadline=None)
@given(labelled(), st.floats(0.05, 0.95))
def test_a_fixed_condition_keeps_its_threshold_and_its_prompts_count(data, given_th):
    score, unsafe, group, cond, budget = data
    th = condition_thresholds(
        score, unsafe, group, cond, CONDITIONS, np.ones(len(score), bool), budget, fixed={"long": given_th}
    )
    assert th["long"] == given_th and list(th) == list(CONDITIONS)
    b = blocked(score, cond, CONDITIONS, th)
    fixed_alone = blocked(score, cond, CONDITIONS, {"long": given_th, "plain": 2.0})
    for g in ("en", "es"):
        safe = ~unsafe & (group == g)
        if safe.any() and fixed_alone[safe].mean() <= budget:
            assert b[safe].mean() <= budget


def test_each_condition_gets_the_lowest_threshold_its_safe_prompts_allow():
    # long prompts' safe ones score higher than plain ones': one threshold would waste recall on plain prompts
    score = np.array([0.9, 0.8, 0.3, 0.2, 0.95, 0.85, 0.5, 0.4])
    unsafe = np.array([False, False, False, False, True, True, True, True])
    cond = np.array([0, 0, 1, 1, 0, 0, 1, 1])  # long, long, plain, plain, ...
    group = np.array(["en"] * 8)
    th = condition_thresholds(score, unsafe, group, cond, CONDITIONS, np.ones(8, bool), 0.0)
    assert th == {"long": 0.95, "plain": 0.4}
    assert blocked(score, cond, CONDITIONS, th).tolist() == [False] * 4 + [True, False, True, True]
    # a budget of one safe prompt in four lets the long threshold drop to the highest safe long score
    th = condition_thresholds(score, unsafe, group, cond, CONDITIONS, np.ones(8, bool), 0.25)
    assert (
        blocked(score, cond, CONDITIONS, th)[~unsafe].sum() == 1 and blocked(score, cond, CONDITIONS, th)[unsafe].all()
    )


def test_rows_outside_the_mask_and_groups_not_named_do_not_constrain():
    score = np.array([0.9, 0.1, 0.5])
    unsafe = np.array([False, False, True])
    group = np.array(["other", "en", "en"])
    cond = np.array([1, 1, 1])
    th = condition_thresholds(score, unsafe, group, cond, CONDITIONS, np.ones(3, bool), 0.0, groups=["en"])
    assert th["plain"] == 0.5  # the "other" safe row at 0.9 would be blocked, and does not count
    th = condition_thresholds(score, unsafe, group, cond, CONDITIONS, np.array([True, True, True]), 0.0)
    assert th["plain"] > 0.9
