"""A cloud container attempt end to end below the workflow's Batch call: a Run state that really waits on its task
token, the cloud dispatch (the token's hash and the task token on the attempt; SubmitJob captured), then the real
runtime as the supervisor, given the override's token and the node API's URL, through the local gateway (the
exchange unsigned, then only the vended session: the gateway holds no other key) against the node API handler on
moto: it stages the job
volume, a stand-in tenant writes its output once the ready file exists, and the supervisor's ``complete`` ends the
Run state. The token is single-use."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid

import urllib3

from gpufleet.batchdef import SUPERVISOR_TOKEN_ENV
from gpufleet.clock import SystemClock
from gpufleet.devstack.gateway import Gateway, moto_sessions
from gpufleet.local.ecs_task import TaskMetadata
from gpufleet.nodeapi.app import EXCHANGE_PATH
from gpufleet.nodeapi.cloud_dispatch import CloudDispatchSettings, dispatch_cloud
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.fakes.jobdefs import MemoryJobDefinitions

IMAGE = "registry.example/t1/train@sha256:" + "d" * 64


def place_cloud(world, job_id: str, epoch: int) -> dict:
    spec = {"workload": {"kind": "container", "image": IMAGE, "command": ["train"], "env": {"LR": "0.5"}}}
    placement = {
        "epoch": epoch,
        "attempt": epoch,
        "target": "cloud",
        "pool": "cloud-spot",
        "job_queue": "gf-gpu-spot",
        "gpu_milli": 1000,
        "price_per_gpu_hour": 3.0,
    }
    world.put_cloud_attempt(job_id, epoch, placement, spec)
    b = world.buckets
    envelope = {
        "job_id": job_id,
        "attempt": epoch,
        "epoch": epoch,
        "stage": "container",
        "s3": {
            "bucket_outputs": b["outputs"],
            "bucket_checkpoints": b["checkpoints"],
            "bucket_logs": b["logs"],
            "output_prefix": f"jobs/{job_id}/",
            "checkpoint_prefix": f"jobs/{job_id}/",
            "log_prefix": f"jobs/{job_id}/attempt-{epoch:04d}/",
        },
        "placement": placement,
        "tables": {"jobs": world.tables.jobs},
        "heartbeat_seconds": 30,
    }
    return {
        "target": "cloud",
        "job_queue": "gf-gpu-spot",
        "envelope": envelope,
        "batch_job_name": f"{job_id}-e{epoch}",
        "command": [],
        "attempt_duration_seconds": 600,
    }


def dispatched(world, job_id: str, run: dict) -> tuple[str, dict]:
    """Start the Run state; hand its message to the cloud dispatch (what RunCloudContainer would do)."""
    sfn, sqs = world.c["stepfunctions"], world.c["sqs"]
    arn = sfn.start_execution(
        stateMachineArn=world.machine,
        name=f"{job_id}-{uuid.uuid4().hex[:6]}",
        input=json.dumps({"job_id": job_id, "run": run}),
    )["executionArn"]
    submitted: list[dict] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for m in sqs.receive_message(QueueUrl=world.control_queue, WaitTimeSeconds=1).get("Messages", []):
            sqs.delete_message(QueueUrl=world.control_queue, ReceiptHandle=m["ReceiptHandle"])
            settings = CloudDispatchSettings(
                prefix="gf",
                supervisor_image="rt@sha256:" + "e" * 64,
                execution_role_arn="arn:aws:iam::123456789012:role/exec",
                log_group="lg",
                region="us-east-1",
                node_api_url="(set below)",
                run_timeout_seconds=3600,
            )
            event = {**json.loads(m["Body"]), "batch": {"job_queue": "arn:aws:batch:us-east-1:1:job-queue/gf-gpu-spot"}}
            dispatch_cloud(
                world.runs,
                MemoryJobDefinitions(),
                lambda **kw: submitted.append(kw) or {"jobId": "b1"},
                SystemClock(),
                settings,
                event,
            )
            return arn, submitted[0]
    raise AssertionError("the Run state never dispatched")


def test_the_supervisor_runs_an_attempt_on_its_token_and_completes_the_run_state(world, tmp_path, monkeypatch):
    job_id, epoch = f"cj-{uuid.uuid4().hex[:8]}", 2
    arn, request = dispatched(world, job_id, place_cloud(world, job_id, epoch))
    sup = request["ecsPropertiesOverride"]["taskProperties"][0]["containers"][0]
    env = {e["name"]: e["value"] for e in sup["environment"]}
    gateway = Gateway(
        lambda: lambda event, context: world.api.handle(event),
        [],
        open_routes=[("POST", EXCHANGE_PATH)],
        resolve=moto_sessions([world.supervisor_role], "123456789012"),
    ).start()
    meta = TaskMetadata(["supervisor", "tenant"])
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", meta.uri)
    job_dir = tmp_path / "job"

    def tenant() -> None:
        while not (job_dir / ".supervisor-ready").exists():
            time.sleep(0.02)
        meta.set("tenant", "RUNNING")
        (job_dir / "output" / "model.txt").write_text("trained\n")
        meta.set("tenant", "STOPPED", 0)

    threading.Thread(target=tenant, daemon=True).start()
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"),
        container_sidecar="tenant",
        supervisor_token=env[SUPERVISOR_TOKEN_ENV],
        node_api_url=gateway.url,
        sidecar_job_dir=str(job_dir),
        sidecar_poll_s=0.05,
    )
    try:
        code = main(sup["command"][3:], settings=settings, stdout=io.StringIO(), install_signals=False)
        done = world.wait_done(arn)
        again = urllib3.PoolManager().request(
            "POST",
            gateway.url + EXCHANGE_PATH,
            body=json.dumps({"job_id": job_id, "epoch": epoch, "token": env[SUPERVISOR_TOKEN_ENV]}).encode(),
        )
    finally:
        gateway.stop()
        meta.close()
    assert code == 0
    assert done["status"] == "SUCCEEDED", done
    assert json.loads(done["output"])["generated"]["files"] == 1
    got = world.c["s3"].get_object(Bucket=world.buckets["outputs"], Key=f"jobs/{job_id}/output/e0002/model.txt")
    assert got["Body"].read() == b"trained\n"
    assert world.job(job_id)["status"] == "RUNNING"  # CompleteRun's move is the workflow's, not the supervisor's
    assert "supervisor_token_claimed_at" in world.attempt(job_id, epoch)
    assert again.status == 403  # the token was used once
