"""``batch:submitJob.sync`` through a moto server: the local runner runs the job in a subprocess that reaches moto."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpufleet.local.harness import LocalStack

SCRIPT = (
    "import boto3, os, sys; "
    "boto3.client('s3').put_object(Bucket='jobs', Key=os.environ['AWS_BATCH_JOB_ID'], Body=os.environ['MSG'].encode()); "
    "sys.exit(int(os.environ['CODE']))"
)


def _machine(queue: str, definition: str) -> str:
    return json.dumps({
        "StartAt": "Run",
        "States": {"Run": {
            "Type": "Task",
            "Resource": "arn:aws:states:::batch:submitJob.sync",
            "Parameters": {
                "JobName": "local", "JobQueue": queue, "JobDefinition": definition,
                "ContainerOverrides": {
                    "Command": ["python", "-c", SCRIPT],
                    "Environment": [{"Name": "CODE", "Value.$": "$.code"}, {"Name": "MSG", "Value": "hello"}],
                },
            },
            "End": True,
        }},
    })


def _finished(sfn, arn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = sfn.describe_execution(executionArn=arn)
        if d["status"] != "RUNNING":
            return d
        time.sleep(0.1)
    raise AssertionError("execution still running")


@pytest.fixture(scope="module")
def server():
    before = os.environ.get("MOTO_PORT")
    stack = LocalStack(mode="server").start()
    assert os.environ["MOTO_PORT"] == stack.endpoint_url.rsplit(":", 1)[1]
    yield stack
    stack.stop()
    assert os.environ.get("MOTO_PORT") == before  # the harness restores what it changed


def test_submit_job_sync_success_and_failure(server):
    iam, batch, sfn, s3 = (server.client(n) for n in ("iam", "batch", "stepfunctions", "s3"))
    role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = batch.create_compute_environment(computeEnvironmentName="local-ce", type="UNMANAGED", state="ENABLED",
                                          serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="gpu", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])["jobQueueArn"]
    jd = batch.register_job_definition(jobDefinitionName="rt", type="container",
                                       containerProperties={"image": "x", "vcpus": 1, "memory": 512,
                                                            "command": ["python", "-m", "gpufleet.runtime"]})
    s3.create_bucket(Bucket="jobs")
    sm = sfn.create_state_machine(name="sync", definition=_machine(queue, jd["jobDefinitionArn"]), roleArn=role)

    ok = _finished(sfn, sfn.start_execution(stateMachineArn=sm["stateMachineArn"], name="ok", input='{"code": "0"}')["executionArn"])
    assert ok["status"] == "SUCCEEDED", ok
    out = json.loads(ok["output"])
    assert out["Status"] == "SUCCEEDED" and out["Container"]["ExitCode"] == 0
    assert s3.get_object(Bucket="jobs", Key=out["JobId"])["Body"].read() == b"hello"

    bad = _finished(sfn, sfn.start_execution(stateMachineArn=sm["stateMachineArn"], name="bad", input='{"code": "30"}')["executionArn"])
    assert bad["status"] == "FAILED" and bad["error"] == "States.TaskFailed"
    cause = json.loads(bad["cause"])
    assert cause["Status"] == "FAILED" and cause["Container"]["ExitCode"] == 30
    assert [r.exit_code for r in server.batch_runner.records] == [0, 30]


def test_abort_executions_ends_an_execution_parked_on_a_token(server):
    sqs, sfn, iam = server.client("sqs"), server.client("stepfunctions"), server.client("iam")
    url = sqs.create_queue(QueueName="parked")["QueueUrl"]
    role = iam.create_role(RoleName="parker", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    definition = json.dumps({"StartAt": "Park", "States": {"Park": {
        "Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
        "Parameters": {"QueueUrl": url, "MessageBody": {"t.$": "$$.Task.Token"}}, "End": True}}})
    sm = sfn.create_state_machine(name="parker", definition=definition, roleArn=role)["stateMachineArn"]
    arn = sfn.start_execution(stateMachineArn=sm, name="p")["executionArn"]
    deadline = time.monotonic() + 15
    while not sqs.receive_message(QueueUrl=url).get("Messages") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.abort_executions() == 1
    assert _finished(sfn, arn, timeout=5)["status"] in ("ABORTED", "FAILED")  # ended, not parked until timeout
