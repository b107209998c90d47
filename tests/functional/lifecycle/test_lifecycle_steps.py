"""Lifecycle steps that talk to AWS themselves, on moto: the happy path (S3 checkpoint tags, the webhook queue's
filter), Notify (SQS) and a cancel finding a finished Batch job. The other steps' cases run over the in-memory
stores: tests/unit/lifecycle/test_lifecycle_steps_memory.py."""

from __future__ import annotations

import json

from gpufleet.clock import FakeClock
from gpufleet.lifecycle import cancel, steps
from gpufleet.metrics import RecordingMetrics
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs, ledger
from gpufleet.store.fencing import fenced_update, issue_epoch
from gpufleet.store.workflow import AwsBatchJobs
from gpufleet.tables import TableNames

T = TableNames()
CLOCK = FakeClock()


def place(aws, job_id: str, target: str = "onprem") -> dict:
    job = jobs.get_job(aws["dynamodb"], T.jobs, job_id)
    epoch = int(job["current_epoch"]) + 1
    p = {"epoch": epoch, "attempt": epoch, "target": target, "pool": "onprem-a", "node": f"n{epoch}",
         "queue_url": "https://q", "gpu_milli": 1000, "price_per_gpu_hour": 3.6,
         "job_queue": "gpufleet-gpu-spot", "job_definition": "gpufleet-gpu"}
    issue_epoch(aws["dynamodb"], T.jobs, job_id, epoch - 1, {"placement": p})
    jobs.transition(aws["dynamodb"], T.jobs, job_id, [S.PENDING], S.SCHEDULED, remove=("placement_token",),
                    clock=CLOCK)
    return p


def test_happy_path_steps_publish_and_bill_once(deps, new_job, aws, released):
    deps.metrics = metrics = RecordingMetrics()
    job = new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p = place(aws, job["job_id"])
    state = {"job_id": job["job_id"], "placement": p}
    run = steps.prepare_run(deps, state)
    assert run["envelope"]["epoch"] == p["epoch"] and run["command"][:3] == ["python", "-m", "gpufleet.runtime"]
    state["result"] = {"epoch": p["epoch"], "gpu_seconds": 7200.0, "generated": {"key": "g", "sha256": "x"}}
    state["completed"] = {"value": steps.complete_run(deps, state)}
    assert jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])["status"] == "FINALIZING"
    fenced_update(aws["dynamodb"], T.jobs, job["job_id"], p["epoch"], {"output": {"video_key": "v"}})
    bucket = deps.settings.checkpoints_bucket
    ckpt = f"jobs/{job['job_id']}/ckpt-0002.bin"
    aws["s3"].put_object(Bucket=bucket, Key=ckpt, Body=b"x", Tagging="owner=runtime")
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    tags = aws["s3"].get_object_tagging(Bucket=bucket, Key=ckpt)["TagSet"]
    assert {"Key": "gpufleet:job-ended", "Value": "true"} in tags and {"Key": "owner", "Value": "runtime"} in tags
    billing = steps.bill(deps, job["job_id"])
    assert billing["amount_usd"] == "7.200000" and billing["ledger_entry_written"] is True
    assert steps.bill(deps, job["job_id"])["ledger_entry_written"] is False  # retried Bill: no second entry
    assert len(ledger.entries(aws["dynamodb"], T.ledger, job["job_id"])) == 1
    assert released == [(job["job_id"], p["epoch"])]
    # metrics (EMF): the run's GPU-seconds by pool, the job's end by outcome (a retried Bill emits again)
    assert metrics.values("GpuSeconds") == metrics.values("GpuSeconds", Pool="onprem-a") == [7200.0]
    assert metrics.values("JobsEnded", Outcome="SUCCEEDED") == [1.0, 1.0]
    # the finalize phase (CompleteRun to Publish; the fake clock did not move) and the attempt's placement mark
    assert metrics.values("PhaseSeconds", Phase="finalize") == [0.0]
    assert jobs.get_job(aws["dynamodb"], T.jobs, job["job_id"])["last_run"]["phases"]["durations"] == {"finalize": 0.0}
    msg = aws["sqs"].receive_message(QueueUrl=deps.settings.webhook_queue_url)
    assert "Messages" not in msg  # no webhook in the spec: filtered out


def test_cancel_propagate_skips_finished_cloud_batch_job(aws, new_job, deps):
    """The simple Batch backend finishes jobs at submission: propagate finds it by name and leaves it."""
    b = aws["batch"]
    import boto3

    iam_role = boto3.client("iam", region_name="us-east-1").create_role(
        RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = b.create_compute_environment(computeEnvironmentName="gpufleet-ce", type="UNMANAGED", state="ENABLED",
                                      serviceRole=iam_role)["computeEnvironmentArn"]
    b.create_job_queue(jobQueueName="gpufleet-gpu-spot", state="ENABLED", priority=1,
                       computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce}])
    b.register_job_definition(jobDefinitionName="gpufleet-gpu", type="container",
                              containerProperties={"image": "i", "vcpus": 1, "memory": 512})
    job = new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p = place(aws, job["job_id"], target="cloud")
    submitted = b.submit_job(jobName=f"{job['job_id']}-e{p['epoch']}", jobQueue="gpufleet-gpu-spot",
                             jobDefinition="gpufleet-gpu")
    requested = jobs.request_cancel(aws["dynamodb"], T.jobs, job["job_id"], clock=CLOCK)
    done = cancel.propagate(requested, batch=AwsBatchJobs(b))
    assert b.describe_jobs(jobs=[submitted["jobId"]])["jobs"][0]["status"] == "SUCCEEDED"
    assert not any(a.startswith("batch_terminated") for a in done["actions"])


def test_notify_enqueues_completed_event(deps, new_job, aws):
    job = new_job(webhook="https://hooks.example.com/x")
    steps.mark_terminal(deps, {"job_id": job["job_id"], "prompt": {"value": {"reason": "r"}}}, "REJECTED")
    out = steps.notify(deps, job["job_id"])
    (msg,) = aws["sqs"].receive_message(QueueUrl=deps.settings.webhook_queue_url)["Messages"]
    event = json.loads(msg["Body"])
    assert event["msg_id"] == out["msg_id"] and json.loads(event["body"])["data"]["status"] == "REJECTED"
