"""UploadPacer: the overhead budget of asynchronous checkpoint uploads (pure logic, simulated clock)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.runtime.ckptpace import UploadPacer, blocked_wait_s


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def simulate(pacer: UploadPacer, clock: Clock, base: list[float], extra: list[float], upload_steps: list[int]):
    """A loop that submits a snapshot after every step to a one-in-flight writer.

    Step i takes ``base[i]`` seconds, plus ``extra[i]`` if an upload was in flight during it; the k-th
    upload stays in flight for ``upload_steps[k]`` steps. Returns (upload start step indices, the true
    extra time uploads cost, the true cost of each upload, what the pacer charged for each upload).
    """
    starts: list[int] = []
    costs: list[float] = []
    charged: list[float] = []
    inflight_left = 0
    true_extra = 0.0
    for i, b in enumerate(base):
        if inflight_left == 0 and pacer.may_start():  # the writer looks before the step
            pacer.started()
            starts.append(i)
            costs.append(0.0)
            charged.append(pacer.charged)
            inflight_left = upload_steps[(len(starts) - 1) % len(upload_steps)]
        overlapped = inflight_left > 0
        cost = extra[i] if overlapped else 0.0
        clock.t += b + cost
        true_extra += cost
        if overlapped:
            costs[-1] += cost
            inflight_left -= 1
            if inflight_left == 0:
                pacer.finished()
        pacer.tick()
    charges = [b - a for a, b in zip(charged, [*charged[1:], pacer.charged], strict=True)]
    return starts, true_extra, costs, charges


steps_st = st.integers(min_value=5, max_value=300)


@settings(max_examples=150, deadline=None)
@given(n=steps_st, budget=st.sampled_from([0.01, 0.05, 0.1, 0.3]), step_s=st.floats(0.001, 2.0),
       jitter=st.floats(0.0, 0.3), interference=st.floats(0.0, 3.0), seed=st.integers(0, 2**32 - 1),
       uploads=st.lists(st.integers(1, 6), min_size=1, max_size=8))
def test_what_uploads_cost_the_loop_stays_within_the_budget_plus_one_upload(n, budget, step_s, jitter,
                                                                             interference, seed, uploads):
    # per-step noise from a drawn seed: hypothesis explores the seed, not 600 separate draws per example
    import random

    rng = random.Random(seed)
    clock = Clock()
    pacer = UploadPacer(budget, max_lag_s=1e9, clock=clock)
    base = [step_s * (1 + rng.uniform(0.0, jitter)) for _ in range(n)]
    extra = [step_s * rng.uniform(0.0, interference) for _ in range(n)]
    _starts, _true, costs, charges = simulate(pacer, clock, base, extra, uploads)
    slack = 1e-9 * n
    # Its own accounting: an upload starts only out of credit, so everything but the last upload was paid for.
    last = charges[-1] if charges else 0.0
    assert pacer.charged <= budget * pacer.loop_s + last + slack
    # And what it charges is never below the true cost, less the spread of clean step times (the baseline's noise).
    assert pacer.charged >= sum(costs) - n * step_s * jitter - slack


@settings(max_examples=100, deadline=None)
@given(n=steps_st, step_s=st.floats(0.001, 5.0), uploads=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_uploads_that_cost_the_loop_nothing_are_never_held_back(n, step_s, uploads):
    clock = Clock()
    pacer = UploadPacer(0.05, max_lag_s=1e9, clock=clock)
    starts, _, _, _ = simulate(pacer, clock, [step_s] * n, [0.0] * n, uploads)
    # The first tick starts the clock and one clean step makes the baseline, so the first upload starts
    # before step 2; after that one clean step between uploads keeps the baseline fresh, and nothing else waits.
    expected, i, k = [], 2, 0
    while i < n:
        expected.append(i)
        i += uploads[k % len(uploads)] + 1
        k += 1
    assert starts == expected


@settings(max_examples=100, deadline=None)
@given(n=st.integers(20, 200), step_s=st.floats(0.01, 1.0), lag_steps=st.integers(2, 30))
def test_the_recovery_point_never_lags_longer_than_max_lag_even_over_budget(n, step_s, lag_steps):
    clock = Clock()
    max_lag = lag_steps * step_s
    pacer = UploadPacer(0.01, max_lag_s=max_lag, clock=clock)
    starts, _, _, _ = simulate(pacer, clock, [step_s] * n, [10 * step_s] * n, [1])  # each upload costs 10 steps
    assert starts
    # Between two starts: at most max_lag, plus the step in which the writer looks, plus float rounding.
    for a, b in zip(starts, starts[1:], strict=False):
        assert b - a <= lag_steps + 2
    assert pacer.forced >= len(starts) - 1  # over budget: every later upload came from the max-lag rule


def test_over_budget_uploads_are_spaced_to_the_budget():
    clock = Clock()
    pacer = UploadPacer(0.05, max_lag_s=1e9, clock=clock)
    n = 2000
    starts, true_extra, _, _ = simulate(pacer, clock, [0.010] * n, [0.005] * n, [2])  # each upload costs 10 ms
    loop = n * 0.010 + true_extra
    assert true_extra / loop == pytest.approx(0.05, abs=0.006)
    assert pacer.charged == pytest.approx(true_extra)  # exact here: every clean step takes the baseline
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 15  # 10 ms of debt repaid at 0.5 ms per 10 ms step: ~20 steps


def test_no_budget_means_no_pacing_and_bad_arguments_are_refused():
    clock = Clock()
    pacer = UploadPacer(0.0, max_lag_s=5.0, clock=clock)
    assert pacer.may_start()  # even before any step
    starts, _, _, _ = simulate(pacer, clock, [0.01] * 50, [1.0] * 50, [1])
    assert starts == list(range(50))
    for bad in ({"budget": -0.1, "max_lag_s": 1.0}, {"budget": 0.05, "max_lag_s": 0.0},
                {"budget": 0.05, "max_lag_s": 1.0, "window": 0}, {"budget": 0.05, "max_lag_s": 1.0, "min_clean": 0},
                {"budget": 0.05, "max_lag_s": 1.0, "window": 4, "min_clean": 5}):
        with pytest.raises(ValueError):
            UploadPacer(**bad)


def test_credit_is_capped_so_a_quiet_stretch_cannot_fund_a_burst():
    clock = Clock()
    pacer = UploadPacer(0.05, max_lag_s=1e9, clock=clock, window=16)
    for _ in range(10_000):
        clock.t += 0.01
        pacer.tick()
    assert pacer.credit == pytest.approx(0.05 * 16 * 0.01)


def test_blocked_writers_look_again_soon_and_by_the_max_lag_deadline():
    clock = Clock()
    pacer = UploadPacer(0.05, max_lag_s=0.2, clock=clock)
    assert blocked_wait_s(None) is None
    assert blocked_wait_s(pacer) == pytest.approx(0.2)
    clock.t += 0.5
    assert blocked_wait_s(pacer) == pytest.approx(0.01)
    assert UploadPacer(0.05, max_lag_s=60, clock=clock).seconds_until_lag() == pytest.approx(60)
