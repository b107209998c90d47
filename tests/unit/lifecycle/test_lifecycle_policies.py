"""Pure lifecycle policies: backoff with full jitter, classification, decisions, billing."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.lifecycle.billing import Outcome, Rule, charge_for, gpu_seconds
from gpufleet.lifecycle.classify import Failure, classify
from gpufleet.lifecycle.decide import Accounting, decide
from gpufleet.lifecycle.retry import RetryPolicy, backoff_seconds
from gpufleet.lifecycle.settings import LifecycleSettings
from gpufleet.status import FailureClass

POLICY = RetryPolicy(base_s=2, cap_s=60, failure_budget=3, quarantine_after_workers=3, max_preemptions=5)
PLACEMENT = {"epoch": 4, "node": "node-7", "pool": "onprem-a"}


@given(n=st.integers(0, 10_000), u=st.floats(0, 1, exclude_max=True))
def test_backoff_within_full_jitter_bounds(n, u):
    wait = backoff_seconds(n, u, POLICY)
    assert POLICY.floor_s <= wait <= min(POLICY.cap_s, POLICY.base_s * 2.0 ** min(n, 63))


@given(n=st.integers(0, 20), u1=st.floats(0, 1, exclude_max=True), u2=st.floats(0, 1, exclude_max=True))
def test_backoff_monotone_in_draw(n, u1, u2):
    lo, hi = sorted((u1, u2))
    assert backoff_seconds(n, lo, POLICY) <= backoff_seconds(n, hi, POLICY)


def test_backoff_ceiling_doubles_then_caps():
    assert [round(backoff_seconds(n, 0.999999, POLICY)) for n in range(7)] == [2, 4, 8, 16, 32, 60, 60]


@pytest.mark.parametrize("bad", [{"cap_s": 1, "base_s": 2}, {"failure_budget": -1}, {"floor_s": 100, "cap_s": 50}])
def test_retry_policy_rejects_invalid(bad):
    with pytest.raises(ValidationError):
        RetryPolicy(**bad)


def test_backoff_rejects_bad_draw():
    with pytest.raises(ValueError):
        backoff_seconds(0, 1.0, POLICY)


@pytest.mark.parametrize(
    ("error", "expected", "lost"),
    [
        ({"Error": "States.Timeout"}, FailureClass.SYSTEM, True),
        ({"Error": "States.HeartbeatTimeout"}, FailureClass.SYSTEM, True),
        ({"Error": "PREEMPTED", "Cause": json.dumps({"epoch": 4, "node": "node-7", "detail": "drain"})},
         FailureClass.PREEMPTED, False),
        ({"Error": "USER_ERROR", "Cause": json.dumps({"epoch": 4, "detail": "bad input"})}, FailureClass.USER, False),
        ({"Error": "SYSTEM_ERROR", "Cause": "not json"}, FailureClass.SYSTEM, False),
        ({"Error": "FENCED", "Cause": "{}"}, FailureClass.PREEMPTED, False),
        ({"Error": "Lambda.Unknown", "Cause": "boom"}, FailureClass.SYSTEM, False),
        ({"Error": "Cancelled", "Cause": "x"}, FailureClass.CANCELLED, False),
    ],
)
def test_classify_worker_errors_and_timeouts(error, expected, lost):
    f = classify(error, PLACEMENT, cancel_requested=False)
    assert f.cls is expected and f.lost is lost


@pytest.mark.parametrize(
    ("desc", "expected"),
    [
        ({"Status": "FAILED", "StatusReason": "Host EC2 (instance i-0abc) terminated."}, FailureClass.PREEMPTED),
        ({"status": "FAILED", "statusReason": "Essential container in task exited",
          "container": {"exitCode": 30}}, FailureClass.PREEMPTED),
        ({"Status": "FAILED", "Container": {"ExitCode": 10, "Reason": "bad spec"}}, FailureClass.USER),
        ({"Status": "FAILED", "Container": {"ExitCode": 137, "Reason": "OutOfMemoryError"}}, FailureClass.SYSTEM),
        ({"Status": "FAILED", "StatusReason": "CannotPullContainerError"}, FailureClass.SYSTEM),
        ({"Status": "FAILED", "Container": {"ExitCode": 40}}, FailureClass.CANCELLED),
        # a cloud gang's multi-node parallel job: no Container, the main node's exit on its attempt
        ({"Status": "FAILED", "NodeProperties": {"NumNodes": 2}, "Container": {"LogStreamName": "s"},
          "Attempts": [{"Container": {"ExitCode": 10}}]}, FailureClass.USER),
        ({"Status": "FAILED", "Attempts": [{"Container": {"ExitCode": 30}}]}, FailureClass.PREEMPTED),
    ],
)
def test_classify_batch_status_reasons(desc, expected):
    f = classify({"Error": "States.TaskFailed", "Cause": json.dumps(desc)}, {"epoch": 2, "pool": "gpu-spot"},
                 cancel_requested=False)
    assert f.cls is expected


def test_classify_batch_wall_time_from_timestamps():
    desc = {"Status": "FAILED", "StartedAt": 1_000, "StoppedAt": 31_000, "Container": {"ExitCode": 20}}
    f = classify({"Error": "States.TaskFailed", "Cause": json.dumps(desc)}, None, cancel_requested=False)
    assert f.wall_seconds == 30.0


@given(name=st.sampled_from(["States.Timeout", "SYSTEM_ERROR", "PREEMPTED", "USER_ERROR", "States.TaskFailed", "x"]))
def test_cancel_requested_always_wins(name):
    assert classify({"Error": name, "Cause": "{}"}, PLACEMENT, cancel_requested=True).cls is FailureClass.CANCELLED


def _sys(worker):
    return Failure(FailureClass.SYSTEM, "crash", worker)


def test_preemptions_do_not_consume_failure_budget():
    acc = Accounting()
    for _ in range(POLICY.max_preemptions):
        d = decide(acc, Failure(FailureClass.PREEMPTED, "spot"), POLICY, 0.5, started=True)
        assert d.action == "retry" and d.accounting.system_failures == 0
        acc = d.accounting
    d = decide(acc, _sys("n1"), POLICY, 0.5, started=True)
    assert d.action == "retry" and d.accounting.system_failures == 1


def test_preemption_cap_fails_job():
    acc = Accounting(preemptions=POLICY.max_preemptions)
    assert decide(acc, Failure(FailureClass.PREEMPTED, "spot"), POLICY, 0.1, started=True).action == "fail"


def test_quarantine_after_k_distinct_workers():
    acc = Accounting()
    actions = []
    for worker in ("n1", "n2", "n3"):
        d = decide(acc, _sys(worker), POLICY, 0.0, started=True)
        actions.append(d.action)
        acc = d.accounting
    assert actions == ["retry", "retry", "quarantine"]
    assert d.outcome is Outcome.QUARANTINED


def test_same_worker_crashing_exhausts_budget_not_quarantine():
    acc = Accounting()
    actions = []
    for _ in range(POLICY.failure_budget + 1):
        d = decide(acc, _sys("n1"), POLICY, 0.0, started=True)
        actions.append(d.action)
        acc = d.accounting
    assert actions == ["retry"] * POLICY.failure_budget + ["fail"]


@given(workers=st.lists(st.sampled_from(["a", "b", "c", "d", None]), min_size=1, max_size=10),
       u=st.floats(0, 1, exclude_max=True))
def test_decisions_invariants(workers, u):
    acc = Accounting()
    for w in workers:
        d = decide(acc, _sys(w), POLICY, u, started=True)
        assert d.accounting.system_failures == acc.system_failures + 1
        assert d.accounting.crashed_workers >= acc.crashed_workers
        if d.action == "retry":
            assert 0 <= d.wait_seconds <= POLICY.cap_s
            assert len(d.accounting.crashed_workers) < POLICY.quarantine_after_workers
        if d.action != "retry":
            break
        acc = d.accounting


def test_user_error_fails_and_cancel_depends_on_start():
    assert decide(Accounting(), Failure(FailureClass.USER, "x"), POLICY, 0.3, started=True).outcome is Outcome.USER_ERROR
    c = Failure(FailureClass.CANCELLED, "c")
    assert decide(Accounting(), c, POLICY, 0.3, started=False).outcome is Outcome.CANCELLED_BEFORE_START
    assert decide(Accounting(), c, POLICY, 0.3, started=True).outcome is Outcome.CANCELLED_RUNNING


@pytest.mark.parametrize(
    ("outcome", "charged"),
    [(Outcome.SUCCEEDED, True), (Outcome.USER_ERROR, True), (Outcome.CANCELLED_RUNNING, True),
     (Outcome.BLOCKED, True), (Outcome.SYSTEM_FAILURE, False), (Outcome.PREEMPTED, False),
     (Outcome.QUARANTINED, False), (Outcome.CANCELLED_BEFORE_START, False), (Outcome.REJECTED, False)],
)
def test_default_billing_rules(outcome, charged):
    c = charge_for(outcome, 3600.0, 2.5)
    assert c.charged is charged
    assert (c.amount_usd == Decimal("2.500000")) if charged else (c.amount_usd == 0 and c.waiver)


def test_billing_rounds_up_to_unit_and_prices_per_hour():
    assert charge_for(Outcome.SUCCEEDED, 10.2, 3.6).amount_usd == Decimal("0.011000")
    assert gpu_seconds(10, 500, 2) == 10.0


@given(secs=st.floats(0, 1e6), price=st.floats(0, 100))
def test_charge_never_negative_and_waived_is_zero(secs, price):
    for outcome in Outcome:
        c = charge_for(outcome, secs, price)
        assert c.amount_usd >= 0
        assert c.charged or c.amount_usd == 0


def test_billing_policy_from_env_overrides_one_rule():
    env = {"GPUFLEET_BILLING_POLICY": json.dumps({"rules": {"BLOCKED": {"charge": "none", "waiver": "goodwill"}}})}
    p = LifecycleSettings.load(env=env).billing
    assert p.rule(Outcome.BLOCKED) == Rule(charge="none", waiver="goodwill")
    assert p.rule(Outcome.SUCCEEDED).charge == "attempt"
