"""A cloud container job's supervisor (GPUFLEET_CONTAINER_SIDECAR=tenant) through ``main``: it stages the job
volume, writes the ready file, watches the tenant through a loopback task-metadata endpoint, then uploads the
tenant's outputs (exit 0) or fails the job as the user's (exit 3). The "tenant" is a thread of the test that
waits for the ready file, as ECS's ``gate`` container does."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings

SPEC = {"workload": {"kind": "container", "image": "registry.example/tools@sha256:" + "a" * 64, "command": ["true"]}}


class Task:
    """The ECS task metadata endpoint v4 of one task: the tenant's state as the test sets it."""

    def __init__(self) -> None:
        self.tenant = {"Name": "tenant", "KnownStatus": "PENDING"}
        task = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = json.dumps({"Containers": [{"Name": "supervisor", "KnownStatus": "RUNNING"}, task.tenant]})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/v4/t"


def tenant(job: Path, task: Task, exit_code: int) -> threading.Thread:
    def run() -> None:
        ready = job / ".supervisor-ready"
        for _ in range(400):
            if ready.exists():
                break
            threading.Event().wait(0.025)
        task.tenant = {"Name": "tenant", "KnownStatus": "RUNNING"}
        (job / "output" / "result.txt").write_text("done\n")
        (job / "checkpoint" / "state").write_text("step 1\n")
        task.tenant = {"Name": "tenant", "KnownStatus": "STOPPED", "ExitCode": exit_code}

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(("exit_code", "expected"), [(0, ExitCode.SUCCEEDED), (3, ExitCode.USER_ERROR)])
def test_supervisor_runs_the_job_volume_around_the_tenant(aws, tmp_path, monkeypatch, exit_code, expected):
    task = Task()
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", task.uri)
    job_dir = tmp_path / "job"
    aws.put_job("side1", 2, SPEC, status="SCHEDULED")
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"), container_sidecar="tenant", sidecar_job_dir=str(job_dir), sidecar_poll_s=0.05
    )
    t = tenant(job_dir, task, exit_code)
    out = io.StringIO()
    try:
        code = main(
            ["--envelope-json", json.dumps(aws.envelope("side1", 2, SPEC, stage="container"))],
            settings=settings,
            s3=aws.s3,
            dynamodb=aws.ddb,
            stdout=out,
            install_signals=False,
        )
    finally:
        task.server.shutdown()
    t.join(timeout=5)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert code == int(expected), result
    assert (job_dir / ".supervisor-ready").read_text() == "2"
    item = aws.job("side1")
    assert item["status"] == "RUNNING"  # moved before the ready file, fenced
    assert result["command_exit"] == exit_code
    ckpts = aws.keys("bucket_checkpoints", "jobs/side1/")
    assert ckpts, "the checkpoint directory is uploaded at the end"
    with tarfile.open(fileobj=io.BytesIO(aws.get("bucket_checkpoints", sorted(ckpts)[-1]))) as tar:
        assert tar.extractfile("state").read() == b"step 1\n"
    outputs = aws.keys("bucket_outputs", "jobs/side1/output/")
    if exit_code == 0:
        assert outputs == ["jobs/side1/output/e0002/result.txt"]
        assert item["generated"]["files"] == 1
    else:
        assert outputs == [] and "generated" not in item


def test_a_supervisor_token_without_the_node_api_runs_nothing(aws, tmp_path):
    aws.put_job("side2", 1, SPEC, status="SCHEDULED")
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"),
        container_sidecar="tenant",
        sidecar_job_dir=str(tmp_path / "job"),
        supervisor_token="tok",
    )
    out = io.StringIO()
    code = main(
        ["--envelope-json", json.dumps(aws.envelope("side2", 1, SPEC, stage="container"))],
        settings=settings,
        s3=aws.s3,
        dynamodb=aws.ddb,
        stdout=out,
        install_signals=False,
    )
    assert code == int(ExitCode.SYSTEM_ERROR)
    assert "node API" in json.loads(out.getvalue().strip().splitlines()[-1])["detail"]
    assert not (tmp_path / "job").exists() and aws.job("side2")["status"] == "SCHEDULED"


def test_a_refused_task_heartbeat_stops_the_supervisor(aws, tmp_path, monkeypatch):
    """The workflow no longer waits (TaskGone on the node API's heartbeat): the watch ends, CANCELLED."""
    from gpufleet.errors import TaskGone
    from gpufleet.store.jobitem import JobItem

    beats = []

    def refused(self):
        beats.append(1)
        raise TaskGone("the workflow no longer waits on this attempt")

    monkeypatch.setattr(JobItem, "task_heartbeat", refused, raising=False)
    task = Task()  # the tenant never stops
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", task.uri)
    aws.put_job("side3", 1, SPEC, status="SCHEDULED")
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"),
        container_sidecar="tenant",
        sidecar_job_dir=str(tmp_path / "job"),
        sidecar_poll_s=0.05,
    )
    envelope = {**aws.envelope("side3", 1, SPEC, stage="container"), "heartbeat_seconds": 3}
    try:
        code = main(
            ["--envelope-json", json.dumps(envelope)],
            settings=settings,
            s3=aws.s3,
            dynamodb=aws.ddb,
            stdout=io.StringIO(),
            install_signals=False,
        )
    finally:
        task.server.shutdown()
    assert code == int(ExitCode.CANCELLED) and beats == [1]


@pytest.mark.parametrize("cancelled", [True, False])
def test_batchs_sigterm_stops_the_supervisor_as_a_cancel_only_when_the_job_was_cancelled(aws, tmp_path, monkeypatch,
                                                                                          cancelled):
    """TerminateJob (the API's cancel) and a spot reclaim both arrive as SIGTERM: the supervisor reads the job once
    and reports CANCELLED for a cancelled job (its log saying so), PREEMPTED otherwise (it checkpoints either way)."""
    import os
    import signal
    import time

    task = Task()  # the tenant runs until the supervisor stops
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", task.uri)
    job_dir = tmp_path / "job"
    aws.put_job("side4", 1, SPEC, status="SCHEDULED")
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), container_sidecar="tenant",
                               sidecar_job_dir=str(job_dir), sidecar_poll_s=0.05, log_flush_s=0)
    previous = signal.getsignal(signal.SIGTERM)

    def terminate():
        ready = job_dir / ".supervisor-ready"
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        task.tenant = {"Name": "tenant", "KnownStatus": "RUNNING"}
        time.sleep(0.3)
        if cancelled:
            aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#side4"}, "sk": {"S": "META"}},
                                UpdateExpression="SET cancel_requested = :t",
                                ExpressionAttributeValues={":t": {"BOOL": True}})
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=terminate, daemon=True)
    t.start()
    out = io.StringIO()
    try:
        code = main(["--envelope-json", json.dumps(aws.envelope("side4", 1, SPEC, stage="container"))],
                    settings=settings, s3=aws.s3, dynamodb=aws.ddb, stdout=out, install_signals=True)
    finally:
        task.server.shutdown()
        t.join(5)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    expected = ExitCode.CANCELLED if cancelled else ExitCode.PREEMPTED
    assert code == int(expected), out.getvalue()[-500:]
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/side4/"))
    assert (b"cancel requested (after signal SIGTERM)" in logs) is cancelled, logs[-1500:]
    assert aws.keys("bucket_checkpoints", "jobs/side4/")  # uploaded before it stopped
