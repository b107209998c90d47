"""A crash that repeats identically on a second worker is the job's own failure (USER), pure functions:
the fingerprint (gpufleet.crash), classification of the recorded crash, the decision, and the
CollectOutputs error."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gpufleet import crash
from gpufleet.lifecycle.billing import Outcome
from gpufleet.lifecycle.classify import Failure, classify
from gpufleet.lifecycle.decide import Accounting, decide
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.status import FailureClass

POLICY = RetryPolicy(base_s=2, cap_s=60, failure_budget=3, quarantine_after_workers=3)
TRACE_A = '''Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/gpufleet/runtime/denoise.py", line 88, in run
    latents = latents.view(b, c, frames // 4 + 1, h, w)
RuntimeError: shape '[1, 16, 65, 8, 8]' is invalid for input of size 66560 (at 0x7f3a2b1c)
2026-03-01T10:00:01.123Z job job_01jq0000000000000000000000 pid 4242'''
TRACE_B = TRACE_A.replace("/opt/venv/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages").replace(
    "0x7f3a2b1c", "0x55d0aa10").replace("2026-03-01T10:00:01.123Z", "2026-03-02T11:12:13.456Z").replace(
    "job_01jq0000000000000000000000", "job_01jq0000000000000000000001").replace("pid 4242", "pid 17")


def test_fingerprint_ignores_machine_details_and_keeps_the_error():
    assert crash.fingerprint(20, TRACE_A.splitlines()) == crash.fingerprint(20, TRACE_B.splitlines())
    assert crash.fingerprint(20, TRACE_A.splitlines()) != crash.fingerprint(139, TRACE_A.splitlines())
    other = TRACE_A.replace("line 88", "line 89")
    assert crash.fingerprint(20, TRACE_A.splitlines()) != crash.fingerprint(20, other.splitlines())
    assert crash.fingerprint(20, ["a", "", "b"]) == crash.fingerprint(20, ["a", "b"])  # blank lines do not count
    rec = crash.record(20, TRACE_A.splitlines())
    assert rec["fingerprint"] == crash.fingerprint(20, TRACE_A.splitlines()) and len(rec["tail"]) == 5


def test_only_the_last_lines_count():
    head = [f"step {i}" for i in range(100)]
    tail = [f"frame {i}" for i in range(crash.TAIL_LINES)]
    assert crash.fingerprint(139, ["x", *head, *tail]) == crash.fingerprint(139, ["y", *tail])


def _system(worker: str | None, fingerprint: str | None = "fp1") -> Failure:
    return Failure(FailureClass.SYSTEM, "exit 20: crashed", worker, False, 3.0, 1, fingerprint)


def test_the_same_crash_on_a_second_worker_fails_as_user_without_using_the_budget():
    first = decide(Accounting(), _system("node-a"), POLICY, 0.5, started=True)
    assert first.action == "retry" and first.outcome is Outcome.SYSTEM_FAILURE
    assert first.accounting.crashes == {("fp1", "node-a")} and first.accounting.system_failures == 1
    second = decide(first.accounting, _system("node-b"), POLICY, 0.5, started=True)
    assert second.action == "fail" and second.outcome is Outcome.USER_ERROR
    assert second.terminal_status.value == "FAILED" and "deterministic crash" in second.reason
    assert "node-a" in second.reason and "node-b" in second.reason
    assert second.accounting.system_failures == 1  # the budget was not spent on it


def test_same_worker_or_other_fingerprint_or_unknown_worker_stays_system():
    acc = decide(Accounting(), _system("node-a"), POLICY, 0.5, started=True).accounting
    again = decide(acc, _system("node-a"), POLICY, 0.5, started=True)  # the node may be broken
    assert again.action == "retry" and again.outcome is Outcome.SYSTEM_FAILURE
    other = decide(acc, _system("node-b", "fp2"), POLICY, 0.5, started=True)
    assert other.action == "retry" and other.accounting.crashes == {("fp1", "node-a"), ("fp2", "node-b")}
    nobody = decide(acc, _system(None), POLICY, 0.5, started=True)
    assert nobody.action == "retry"
    unrecorded = decide(acc, _system("node-b", None), POLICY, 0.5, started=True)  # killed from outside
    assert unrecorded.action == "retry"


def test_accounting_crash_items_round_trip():
    acc = Accounting(crashes=frozenset({("fp1", "node-a"), ("fp2", "arn:aws:ecs:task/x|y")}))
    assert Accounting.parse_crashes(acc.crash_items()) == acc.crashes
    assert Accounting.parse_crashes(["junk", "|x", None]) == frozenset()


@given(workers=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8),
       fps=st.lists(st.sampled_from(["f1", "f2", None]), min_size=8, max_size=8), u=st.floats(0, 1, exclude_max=True))
def test_a_repeated_fingerprint_on_two_workers_is_user_and_nothing_else_is(workers, fps, u):
    acc = Accounting()
    seen: dict[str, set[str]] = {}
    for worker, fp in zip(workers, fps, strict=False):
        d = decide(acc, _system(worker, fp), POLICY, u, started=True)
        repeated = fp is not None and bool(seen.get(fp, set()) - {worker})
        if repeated:
            assert d.action == "fail" and d.outcome is Outcome.USER_ERROR
            assert d.accounting.system_failures == acc.system_failures  # the budget is never spent on it
            return
        assert d.outcome is not Outcome.USER_ERROR
        if fp is not None:
            seen.setdefault(fp, set()).add(worker)
        if d.action != "retry":
            return
        assert d.accounting.crashes >= acc.crashes
        acc = d.accounting


def test_classify_attaches_the_recorded_fingerprint_to_system_failures_only():
    placement = {"epoch": 2, "node": "node-7", "pool": "onprem-a"}
    rec = {"fingerprint": "abc", "exit_code": 20}
    got = classify({"Error": "SYSTEM_ERROR", "Cause": json.dumps({"epoch": 2, "node": "node-7"})}, placement,
                   cancel_requested=False, crash=rec)
    assert got.cls is FailureClass.SYSTEM and got.fingerprint == "abc"
    lost = classify({"Error": "States.Timeout"}, placement, cancel_requested=False, crash=rec)
    assert lost.fingerprint is None  # a silent worker's last record is not a crash of this attempt
    user = classify({"Error": "USER_ERROR"}, placement, cancel_requested=False, crash=rec)
    assert user.cls is FailureClass.USER and user.fingerprint is None
    cancelled = classify({"Error": "SYSTEM_ERROR"}, placement, cancel_requested=True, crash=rec)
    assert cancelled.cls is FailureClass.CANCELLED


def test_output_too_large_from_collect_outputs_is_a_user_failure():
    cause = json.dumps({"errorMessage": "the job's output (3 files, 9000 bytes) exceeds the per-job cap",
                        "errorType": "OutputTooLarge"})
    got = classify({"Error": "OutputTooLarge", "Cause": cause}, {"epoch": 1, "node": "n"}, cancel_requested=False)
    assert got.cls is FailureClass.USER and "exceeds the per-job cap" in got.reason
    assert decide(Accounting(), got, POLICY, 0.5, started=True).outcome is Outcome.USER_ERROR
