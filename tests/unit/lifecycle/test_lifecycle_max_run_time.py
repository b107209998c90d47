"""The spec's max_run_seconds: an attempt stopped at its limit is classified TIMED_OUT (from the on-prem
agent's report or the Batch container's exit code), ends the job FAILED without a retry, and is charged."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

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
