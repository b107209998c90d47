"""Contract of the workflow adapters (:mod:`gpufleet.store.workflow`) on the fakes and on the AWS adapters
(``store_backends.aws_workflow``: moto's Step Functions and EventBridge; Batch over a client holding unfinished
jobs, which moto cannot).

- Task tokens: ``fail`` / ``succeed`` answer a waiting task once; ``heartbeat`` keeps it waiting; a token no
  task waits on (never issued, answered already, timed out) is the outcome ``False``, never an error.
- Batch: ``terminate_named`` terminates the queue's unfinished jobs of that name and leaves finished ones,
  other names and other queues alone.
- EventBridge: a subscriber sees each event's detail type and detail (through JSON); a bus that does not take
  it raises TransientError.
The AWS adapters' own mapping of other errors (throttling: TransientError; anything else: DependencyFailed)
is checked on the AWS side only, below.
"""

from __future__ import annotations

import json

import pytest
from store_backends import StepFunctionsTasks

from gpufleet.errors import DependencyFailed, TransientError
from gpufleet.store.fakes.workflow import TaskSend
from gpufleet.store.workflow import SfnTaskTokens


def test_a_task_is_answered_once_and_a_token_nobody_waits_on_is_an_outcome(workflow):
    tokens = workflow.tokens
    placed, run, late = workflow.wait("tok-placed"), workflow.wait("tok-run"), workflow.wait("tok-late")
    assert tokens.fail(placed, "CANCELLED", {"job_id": "j1", "reason": "user"}) is True
    assert tokens.fail(placed, "CANCELLED", {"job_id": "j1"}) is False  # answered already
    assert tokens.succeed(placed, {"x": 1}) is False
    assert tokens.heartbeat(run) is True and tokens.heartbeat(run) is True  # still waiting
    assert tokens.succeed(run, {"status": "SUCCEEDED", "epoch": 2}) is True
    assert tokens.heartbeat(run) is False
    workflow.time_out(late)
    assert tokens.heartbeat(late) is False and tokens.fail(late, "CANCELLED", {}) is False
    assert tokens.fail("never-issued", "CANCELLED", {}) is False
    assert tokens.succeed("never-issued", {}) is False
    assert workflow.task_sends() == [
        TaskSend("fail", placed, error="CANCELLED", cause='{"job_id": "j1", "reason": "user"}'),
        TaskSend("heartbeat", run),
        TaskSend("heartbeat", run),
        TaskSend("succeed", run, output='{"epoch": 2, "status": "SUCCEEDED"}'),
    ]


def test_a_long_cause_is_cut_to_what_step_functions_takes(workflow):
    token = workflow.wait()
    assert workflow.tokens.fail(token, "FAILED", {"log": "x" * 40_000}) is True
    (sent,) = workflow.task_sends()
    assert len(sent.cause) == 32768 and sent.cause.startswith('{"log": "xxx')


def test_terminate_named_stops_only_the_unfinished_jobs_of_that_name_and_queue(workflow):
    submit = workflow.submit
    running, runnable = submit("gpu", "j1-e1", "RUNNING"), submit("gpu", "j1-e1", "RUNNABLE")
    finished, failed = submit("gpu", "j1-e1", "SUCCEEDED"), submit("gpu", "j1-e1", "FAILED")
    other_name, other_queue = submit("gpu", "j1-e2", "RUNNING"), submit("cpu", "j1-e1", "RUNNING")
    assert sorted(workflow.batch.terminate_named("gpu", "j1-e1", "cancelled by user")) == sorted([running, runnable])
    assert workflow.batch_state(running) == workflow.batch_state(runnable) == ("FAILED", "cancelled by user")
    assert [workflow.batch_state(j)[0] for j in (finished, failed, other_name, other_queue)] == [
        "SUCCEEDED",
        "FAILED",
        "RUNNING",
        "RUNNING",
    ]
    assert workflow.batch.terminate_named("gpu", "j1-e1", "again") == []  # nothing left to stop
    assert workflow.batch.terminate_named("gpu", "nobody", "x") == []


def test_events_reach_a_subscriber_as_sent(workflow):
    workflow.bus.put("JobCapacityFreed", {"job_id": "j1", "gpus": 2, "share": 0.5, "nodes": ("n1",)})
    workflow.bus.put("JobCapacityFreed", {"job_id": "j2", "gpus": 1, "share": 0.25, "nodes": []})
    assert sorted(workflow.events_seen(), key=lambda e: e[1]["job_id"]) == [
        ("JobCapacityFreed", {"job_id": "j1", "gpus": 2, "share": 0.5, "nodes": ["n1"]}),
        ("JobCapacityFreed", {"job_id": "j2", "gpus": 1, "share": 0.25, "nodes": []}),
    ]


def test_a_bus_that_takes_no_events_is_transient(workflow):
    with pytest.raises(TransientError):
        workflow.refusing_bus().put("JobCapacityFreed", {"job_id": "j1"})
    assert workflow.events_seen() == []


# ------------------------------------------------------------------ the AWS adapters' error mapping


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("ThrottlingException", TransientError),
        ("ServiceUnavailable", TransientError),
        ("AccessDeniedException", DependencyFailed),
        ("InvalidOutput", DependencyFailed),
    ],
)
def test_other_step_functions_errors_are_domain_errors(aws, code, error):
    import boto3

    tasks = StepFunctionsTasks(boto3.client("stepfunctions", region_name="us-east-1"))
    token = tasks.wait()
    tasks.fault = code
    for call in (lambda t: t.fail(token, "E", {}), lambda t: t.heartbeat(token), lambda t: t.succeed(token, {})):
        with pytest.raises(error, match=code):
            call(SfnTaskTokens(tasks))
    assert tasks.sent == [] and json.dumps(sorted(tasks.waiting)) == json.dumps([token])
