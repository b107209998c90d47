"""The spec's max_run_seconds: an attempt stopped at its limit is classified TIMED_OUT (from the on-prem
agent's report, the Batch container's exit code, or Batch stopping it at its attempt duration), ends the job FAILED
without a retry, and is charged; RunCloud's Batch attempt duration follows the limit."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpufleet.batchdef import ATTEMPT_MARGIN_SECONDS, BATCH_MIN_ATTEMPT_SECONDS, attempt_duration_seconds
from gpufleet.envelope import ExitCode
from gpufleet.lifecycle.billing import BillingPolicy, Outcome
from gpufleet.lifecycle.classify import classify
from gpufleet.lifecycle.decide import Accounting, decide
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.spec import JobSpec
from gpufleet.status import FailureClass, JobStatus

ONPREM = {"epoch": 2, "attempt": 2, "target": "onprem", "pool": "onprem-a", "node": "n1"}
CLOUD = {"epoch": 2, "attempt": 2, "target": "cloud", "pool": "cloud-ondemand"}


def test_the_agents_report_and_the_batch_exit_code_both_classify_timed_out():
    onprem = classify({"Error": "TIMED_OUT", "Cause": json.dumps(
        {"epoch": 2, "node": "n1", "detail": "maximum run time of 60 s exceeded; killed by SIGKILL"})},
        ONPREM, cancel_requested=False)
    assert onprem.cls is FailureClass.TIMED_OUT and "maximum run time of 60 s" in onprem.reason
    batch = classify({"Error": "States.TaskFailed", "Cause": json.dumps(
        {"Status": "FAILED", "StatusReason": "Essential container in task exited",
         "Container": {"ExitCode": int(ExitCode.TIMED_OUT)}})}, CLOUD, cancel_requested=False)
    assert batch.cls is FailureClass.TIMED_OUT
    # a cancel still wins over the limit
    assert classify({"Error": "TIMED_OUT", "Cause": "{}"}, ONPREM, cancel_requested=True).cls is FailureClass.CANCELLED


def test_timed_out_fails_the_job_without_a_retry_and_is_charged():
    failure = classify({"Error": "TIMED_OUT", "Cause": json.dumps({"detail": "maximum run time of 60 s exceeded"})},
                       ONPREM, cancel_requested=False)
    d = decide(Accounting(), failure, RetryPolicy(), 0.5, started=True)
    assert (d.action, d.outcome, d.terminal_status) == ("fail", Outcome.TIMED_OUT, JobStatus.FAILED)
    assert "maximum run time" in d.reason and d.accounting == Accounting()  # the failure budget is untouched
    rule = BillingPolicy().rule(Outcome.TIMED_OUT)
    assert rule.charge == "attempt" and rule.waiver is None


def _spec(**kw) -> dict:
    return {"workload": {"kind": "container", "image": "localhost/x:1", "command": ["true"]}, **kw}


def test_max_run_seconds_is_validated():
    assert JobSpec.model_validate(_spec(max_run_seconds=3600)).max_run_seconds == 3600
    assert JobSpec.model_validate(_spec()).max_run_seconds is None
    for bad in (0, -1, 604801, 1.5):
        with pytest.raises(ValidationError):
            JobSpec.model_validate(_spec(max_run_seconds=bad))


def test_batch_stopping_an_attempt_at_its_attempt_duration_is_timed_out_whatever_it_exited_with():
    # the runtime hung past max_run_seconds; Batch's SIGTERM made it exit PREEMPTED, which alone would be retried
    for code in (int(ExitCode.PREEMPTED), 137, None):
        container = {} if code is None else {"ExitCode": code}
        failure = classify({"Error": "States.TaskFailed", "Cause": json.dumps(
            {"Status": "FAILED", "StatusReason": "Job attempt duration exceeded timeout", "Container": container})},
            CLOUD, cancel_requested=False)
        assert failure.cls is FailureClass.TIMED_OUT, code
    d = decide(Accounting(), failure, RetryPolicy(), 0.5, started=True)
    assert (d.action, d.outcome) == ("fail", Outcome.TIMED_OUT)


@pytest.mark.parametrize(("max_run", "cap", "expected"), [
    (None, 86400, 86400),  # no limit in the spec: the deployment's run timeout (the job definition's)
    (3600, 86400, 3600 + ATTEMPT_MARGIN_SECONDS),  # the limit, with the margin for the runtime's own stop
    (1, 86400, max(BATCH_MIN_ATTEMPT_SECONDS, 1 + ATTEMPT_MARGIN_SECONDS)),
    (604800, 86400, 86400),  # never beyond the run timeout
    (None, 10, BATCH_MIN_ATTEMPT_SECONDS),  # never below Batch's minimum
])
def test_the_batch_attempt_duration_follows_max_run_seconds(max_run, cap, expected):
    assert attempt_duration_seconds(max_run, cap) == expected
