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


NODE_SCRIPT = (
    "import boto3, json, os, sys, time; "
    "from gpufleet.gang import batch_role, dist_env; "
    "role = batch_role(os.environ, 'job_g', 3, lambda: '127.0.0.1'); "
    "boto3.client('s3').put_object(Bucket='jobs', Key=os.environ['AWS_BATCH_JOB_ID'], Body=json.dumps(dist_env(role)).encode()); "
    "main = os.environ['AWS_BATCH_JOB_NODE_INDEX'] == os.environ['AWS_BATCH_JOB_MAIN_NODE_INDEX']; "
    # the main node ends the job (and stops the others): it first waits, bounded, for every node's record
    "parent = os.environ['AWS_BATCH_JOB_ID'].split('#')[0]; s3 = boto3.client('s3'); "
    "end = time.monotonic() + 30\n"
    "while main and time.monotonic() < end and s3.list_objects_v2(Bucket='jobs', Prefix=parent)['KeyCount'] < 3: "
    "time.sleep(0.1)\n"
    "time.sleep(0 if main else 60); sys.exit(int(os.environ['CODE']) if main else 0)"
)


def _gang_machine(queue: str, definition: str) -> str:
    """RunCloudGang's own states (infra.workflow: the AWS SDK integration's submitJob with NodeOverrides, then
    describeJobs until the job ends) around a minimal loop."""
    from infra.workflow import gang_poll_state, gang_submit_state

    submit = {**gang_submit_state(definition=definition, partition="aws"), "Next": "Poll"}
    return json.dumps({"StartAt": "Run", "States": {
        "Run": submit,
        "Poll": {**gang_poll_state(partition="aws"), "Next": "Ended"},
        "Ended": {"Type": "Choice", "Choices": [
            {"Variable": "$.gang_poll.job.Status", "StringEquals": "SUCCEEDED", "Next": "Done"},
            {"Variable": "$.gang_poll.job.Status", "StringEquals": "FAILED", "Next": "Failed"}],
            "Default": "Wait"},
        "Wait": {"Type": "Wait", "Seconds": 1, "Next": "Poll"},
        "Done": {"Type": "Pass", "InputPath": "$.gang_poll.job", "ResultPath": "$.result", "End": True},
        "Failed": {"Type": "Fail", "Error": "GangFailed"},
    }})


def test_a_multi_node_parallel_job_runs_a_process_per_node_with_batch_variables(server):
    """The local runner emulates AWS Batch multi-node parallel jobs: NumNodes from SubmitJob's NodeOverrides, one
    process per node with Batch's variables (mapped to the torchrun contract by the runtime's batch_role), the job
    ending with its main node (children still running are stopped) and reporting the main node's exit code."""
    iam, batch, sfn, s3 = (server.client(n) for n in ("iam", "batch", "stepfunctions", "s3"))
    role = iam.create_role(RoleName="gang-r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = batch.create_compute_environment(computeEnvironmentName="gang-ce", type="UNMANAGED", state="ENABLED",
                                          serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="gang", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])["jobQueueArn"]
    jd = batch.register_job_definition(jobDefinitionName="rt-gang", type="multinode", nodeProperties={
        "numNodes": 2, "mainNode": 0, "nodeRangeProperties": [{"targetNodes": "0:", "container": {
            "image": "x", "vcpus": 1, "memory": 512, "command": ["false"],
            "environment": [{"name": "CODE", "value": "1"}]}}]})["jobDefinitionArn"]
    s3.create_bucket(Bucket="jobs")
    sm = sfn.create_state_machine(name="gang", definition=_gang_machine(queue, jd), roleArn=role)["stateMachineArn"]

    def run(name: str, code: str) -> dict:
        overrides = {"NumNodes": 3, "NodePropertyOverrides": [{"TargetNodes": "0:", "ContainerOverrides": {
            "Command": ["python", "-c", NODE_SCRIPT], "Environment": [{"Name": "CODE", "Value": code}]}}]}
        state = {"run": {"value": {"batch_job_name": name, "node_overrides": overrides, "attempt_duration_seconds": 600}},
                 "batch": {"job_queue": queue}}
        arn = sfn.start_execution(stateMachineArn=sm, name=name, input=json.dumps(state))
        return _finished(sfn, arn["executionArn"], timeout=60)

    started = time.monotonic()
    ok = run("gang-ok", "0")
    assert ok["status"] == "SUCCEEDED", ok
    parent = json.loads(ok["output"])["result"]["JobId"]
    seen = {i: json.loads(s3.get_object(Bucket="jobs", Key=f"{parent}#{i}")["Body"].read()) for i in range(3)}
    assert [seen[i]["RANK"] for i in range(3)] == ["0", "1", "2"] and {v["WORLD_SIZE"] for v in seen.values()} == {"3"}
    assert {v["MASTER_ADDR"] for v in seen.values()} == {"127.0.0.1"} and len({v["MASTER_PORT"] for v in seen.values()}) == 1
    assert time.monotonic() - started < 30  # the children (sleeping 60 s) were stopped when the main node exited
    nodes = batch.describe_jobs(jobs=[f"{parent}#{i}" for i in range(3)])["jobs"]
    assert sorted(n["jobId"] for n in nodes) == [f"{parent}#{i}" for i in range(3)]
    assert {n["jobId"]: n["status"] for n in nodes}[f"{parent}#0"] == "SUCCEEDED"

    bad = run("gang-bad", "7")  # the main node's exit code decides the job
    assert bad["status"] == "FAILED" and bad["error"] == "GangFailed"
    assert [r.exit_code for r in server.batch_runner.records[-3:] if r.job.environment["AWS_BATCH_JOB_NODE_INDEX"] == "0"] == [7]


#: the stand-in supervisor: what it holds, the ready file, the watch, then the tenant's report copied out
SUPERVISOR = """
import json, os, shutil, sys
from pathlib import Path
from gpufleet.runtime.taskmeta import TenantWatch, endpoint_fetch
job, out = Path(os.environ["GPUFLEET_SIDECAR_JOB_DIR"]), Path(sys.argv[1])
(out / "supervisor.json").write_text(json.dumps(dict(os.environ)))
(job / "output").chmod(0o777)
(job / ".supervisor-ready").write_text("1")
code = TenantWatch(endpoint_fetch(), poll_s=0.1, give_up_s=20).wait()
shutil.copy(job / "output" / "report.txt", out / "report.txt")
sys.exit(code)
"""
#: the tenant (the tools image): its environment, uid, a write to its root, its read of the token's name
TENANT = ("env > /job/output/report.txt; echo uid=$(id -u) >> /job/output/report.txt; "
          "touch /rootfs-write 2>/dev/null && echo root-writable >> /job/output/report.txt; "
          "echo token=${GPUFLEET_SUPERVISOR_TOKEN:-none} >> /job/output/report.txt")


def test_a_multi_container_job_runs_supervisor_and_tenant_apart(server, tmp_path):
    """The local runner emulates a cloud container job's ECS task (gpufleet.local.ecs_task): the supervisor a
    process holding the token and no AWS credentials, the tenant in podman (by digest, uid 65534, read-only root,
    no AWS variable, no token) once the ready file exists, watched through the local task-metadata endpoint."""
    from gpufleet import batchdef
    from gpufleet.local import oci_image
    from gpufleet.local.ecs_task import EcsTaskExecutor

    reason = oci_image.local_oci_unavailable()
    if reason:
        pytest.skip(f"tenant containers unavailable: {reason}")
    local = oci_image.prepare_local()
    image = oci_image.pinned_ref(local.podman)
    batch = server.client("batch")
    iam = server.client("iam")
    role = iam.create_role(RoleName="ecs-r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = batch.create_compute_environment(computeEnvironmentName="ecs-ce", type="UNMANAGED", state="ENABLED",
                                          serviceRole=role)["computeEnvironmentArn"]
    queue = batch.create_job_queue(jobQueueName="ecs-q", state="ENABLED", priority=1,
                                   computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])["jobQueueArn"]
    request = batchdef.job_definition(prefix="loc", image=image, supervisor_image="localhost/gpufleet/runtime:1",
                                      execution_role_arn=role, log_group="lg", region="us-east-1", timeout_s=120,
                                      gpus=0)
    arn = batch.register_job_definition(**request)["jobDefinitionArn"]
    out = tmp_path / "seen"
    out.mkdir()
    override = batchdef.ecs_properties_override(
        supervisor_command=["python", "-c", SUPERVISOR, str(out)], token="tok-secret",
        tenant_command=["sh", "-c", TENANT],
        tenant_env=batchdef.tenant_environment({"GREETING": "hi"}, job_id="j1", attempt=1, epoch=1, resumed=False,
                                               grace_s=5),
        gpus=0, cpu=1, memory_gb=1)
    server.batch_runner.ecs_executor = EcsTaskExecutor(
        local.podman, local.jobs_dir, supervisor_env={"PATH": os.environ["PATH"], "AWS_ACCESS_KEY_ID": "leak",
                                                      "AWS_REGION": "us-east-1", "PYTHONPATH": os.getcwd()})
    started = time.monotonic()
    job = batch.submit_job(jobName="ecs", jobQueue=queue, jobDefinition=arn, ecsPropertiesOverride=override)
    while batch.describe_jobs(jobs=[job["jobId"]])["jobs"][0]["status"] not in ("SUCCEEDED", "FAILED"):
        assert time.monotonic() - started < 60
        time.sleep(0.2)
    described = batch.describe_jobs(jobs=[job["jobId"]])["jobs"][0]
    assert described["status"] == "SUCCEEDED", described
    supervisor = json.loads((out / "supervisor.json").read_text())
    assert supervisor["GPUFLEET_SUPERVISOR_TOKEN"] == "tok-secret" and supervisor["GPUFLEET_CONTAINER_SIDECAR"] == "tenant"
    assert not {k for k in supervisor if k.startswith("AWS_") and k != "AWS_REGION"}  # no credentials
    report = (out / "report.txt").read_text().splitlines()
    assert "GREETING=hi" in report and "GPUFLEET_JOB_ID=j1" in report and "uid=65534" in report
    assert "token=none" in report and "root-writable" not in report
    assert not [line for line in report if line.startswith("AWS_") or "tok-secret" in line]
    assert not list(local.jobs_dir.glob(f"{job['jobId']}*"))  # the job volume is removed
