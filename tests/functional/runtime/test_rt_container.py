"""Container jobs run the image they name (podman, the tools image built from the host's packages): env contract,
checkpoint dir restored/uploaded, SIGTERM forwarded to the command, cancel and exit codes."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.fencing import issue_epoch

# A small training loop: resumes from $GPUFLEET_CHECKPOINT_DIR/step, checkpoints every step,
# writes its environment contract and a result into $GPUFLEET_OUTPUT_DIR, and on SIGTERM
# writes a marker, then exits 143 after saving.
TRAINER = r"""
import json, os, signal, sys, time
ck = os.environ["GPUFLEET_CHECKPOINT_DIR"]
path = os.path.join(ck, "step")
step = int(open(path).read()) if os.path.exists(path) else 0
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
total = int(os.environ["TOTAL"])
print("resumed" if os.environ["GPUFLEET_RESUMED"] == "1" else "fresh", "at", step, flush=True)
while step < total and not stop:
    time.sleep(float(os.environ["STEP_S"]))
    step += 1
    with open(path + ".tmp", "w") as fh:
        fh.write(str(step))
    os.replace(path + ".tmp", path)
    print("step", step, flush=True)
if stop:
    open(os.path.join(ck, "got-sigterm"), "w").write(str(os.getpgrp() == os.getpid()))
    sys.exit(143)
out = os.environ["GPUFLEET_OUTPUT_DIR"]
env = {k: v for k, v in os.environ.items() if k.startswith("GPUFLEET_")}
json.dump({"steps": step, "env": env}, open(os.path.join(out, "result.json"), "w"))
"""


def _spec(total: int, step_s: float, interval: int = 10, image: str = "localhost/gpufleet-test/tools:1") -> dict:
    return {"workload": {"kind": "container", "image": image, "command": ["python3", "-c", TRAINER],
                         "env": {"TOTAL": str(total), "STEP_S": str(step_s)}, "checkpoint_interval_s": interval},
            "resources": {"gpus": 1}}


@pytest.fixture
def settings(oci, tmp_path):
    def make(sub: str = "") -> RuntimeSettings:
        return RuntimeSettings(state_dir=str(tmp_path / sub / "state"), cache_dir=str(tmp_path / sub / "cache"),
                               log_flush_s=0, container_grace_s=5, **oci.settings)

    return make


def _run(aws, envelope, settings, control_hook=None):
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                stdout=out, install_signals=control_hook is not None)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_container_runs_to_completion_with_the_env_contract(aws, settings):
    spec = _spec(3, 0.01)
    aws.put_job("job_c1", 1, spec)
    code, result = _run(aws, aws.envelope("job_c1", 1, spec, stage="container"), settings())
    assert code == ExitCode.SUCCEEDED, result
    got = json.loads(aws.get("bucket_outputs", "jobs/job_c1/output/e0001/result.json"))
    assert got["steps"] == 3
    assert got["env"]["GPUFLEET_JOB_ID"] == "job_c1" and got["env"]["GPUFLEET_EPOCH"] == "1"
    assert got["env"]["GPUFLEET_ATTEMPT"] == "1" and got["env"]["GPUFLEET_RESUMED"] == "0"
    assert {"GPUFLEET_CHECKPOINT_DIR", "GPUFLEET_INPUT_DIR", "GPUFLEET_OUTPUT_DIR"} <= set(got["env"])
    assert aws.job("job_c1")["generated"]["files"] == 1
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_c1/"))
    assert b"[job] step 3" in logs


def test_sigterm_is_forwarded_checkpoint_uploaded_and_next_attempt_resumes(aws, settings):
    spec = _spec(400, 0.02)
    aws.put_job("job_c2", 1, spec)
    previous = signal.getsignal(signal.SIGTERM)

    progress = settings().jobs_path / "job_c2" / "e0001" / "checkpoint" / "step"

    def preempt():  # once the runtime has installed its handler, and the command has made progress
        deadline = time.monotonic() + 60
        while signal.getsignal(signal.SIGTERM) is previous and time.monotonic() < deadline:
            time.sleep(0.01)
        while not progress.exists() and time.monotonic() < deadline:  # the container is up (it starts in ~1 s)
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=preempt, daemon=True)
    timer.start()
    try:
        code, result = _run(aws, aws.envelope("job_c2", 1, spec, stage="container"), settings(),
                            control_hook=True)
    finally:
        timer.join(5)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert code == ExitCode.PREEMPTED, result
    pointer = aws.job("job_c2")["checkpoint"]
    assert pointer["key"].startswith("jobs/job_c2/checkpoints/")

    issue_epoch(aws.ddb, aws.tables.jobs, "job_c2", 1)
    fast = _spec(400, 0.0)
    code, result = _run(aws, aws.envelope("job_c2", 2, fast, stage="container"), settings("node2"))
    assert code == ExitCode.SUCCEEDED, result
    got = json.loads(aws.get("bucket_outputs", "jobs/job_c2/output/e0002/result.json"))
    assert got["env"]["GPUFLEET_RESUMED"] == "1" and got["steps"] == 400
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_c2/attempt-0002/"))
    resumed_at = int(logs.split(b"[job] resumed at ")[1].split(b'"')[0])
    assert resumed_at > 0
    # The command ran in its own process group and received the forwarded SIGTERM.
    import tarfile

    blob = aws.get("bucket_checkpoints", pointer["key"])
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert tar.extractfile("got-sigterm").read() == b"True"


@pytest.mark.parametrize(("job_id", "command", "expected"), [
    ("job_c3a", ["sh", "-c", "exit 3"], ExitCode.USER_ERROR),
    ("job_c3b", ["sh", "-c", "kill -9 $$"], ExitCode.SYSTEM_ERROR),
    ("job_c3c", ["/nonexistent/binary"], ExitCode.USER_ERROR),
])
def test_command_outcomes_map_to_exit_codes(aws, settings, job_id, command, expected):
    # one job per case: a container name is unique per (job, epoch) in production, and a previous case's
    # reaper (set to work when its container was still being removed) kills a later ``podman run`` of its name
    spec = {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1", "command": command}}
    aws.put_job(job_id, 1, spec)
    code, _ = _run(aws, aws.envelope(job_id, 1, spec, stage="container"), settings())
    assert code == expected


@pytest.mark.parametrize(("image", "detail"), [
    ("localhost/gpufleet-test/absent:1", "not in this node's image store"),
    ("docker.io/library/python:3.11", "not in this node's image allowlist"),
])
def test_an_image_the_node_cannot_run_is_a_user_error_before_anything_runs(aws, settings, image, detail):
    spec = _spec(1, 0.0, image=image)
    aws.put_job("job_c5", 1, spec, status="SCHEDULED")
    code, result = _run(aws, aws.envelope("job_c5", 1, spec, stage="container"), settings())
    assert code == ExitCode.USER_ERROR and detail in result["detail"]
    assert aws.job("job_c5")["status"] == "SCHEDULED"  # never RUNNING


def test_cancel_requested_stops_the_command(aws, settings):
    spec = _spec(1000, 0.05)
    aws.put_job("job_c4", 1, spec)
    env = aws.envelope("job_c4", 1, spec, stage="container", heartbeat_seconds=1)

    def cancel():
        time.sleep(0.5)
        aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_c4"}, "sk": {"S": "META"}},
                            UpdateExpression="SET cancel_requested = :t", ExpressionAttributeValues={":t": {"BOOL": True}})

    t = threading.Thread(target=cancel)
    t.start()
    t0 = time.monotonic()
    code, _ = _run(aws, env, settings())
    t.join()
    assert code == ExitCode.CANCELLED
    assert time.monotonic() - t0 < 20


def test_a_sigterm_for_a_cancelled_job_stops_it_as_a_cancel_with_the_short_grace(aws, oci, tmp_path):
    """AWS Batch's TerminateJob (the API's cancel of a cloud job) arrives as SIGTERM, like a spot reclaim: the runtime
    reads the job once, sees the cancel, and stops a TERM-ignoring container with the cancel's grace (at most 4 s)
    instead of the preemption's (30 s here), reporting CANCELLED, not PREEMPTED."""
    spec = {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1",
                         "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]}}
    aws.put_job("job_c7", 1, spec)
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), log_flush_s=0,
                               container_grace_s=30, **oci.settings)
    previous = signal.getsignal(signal.SIGTERM)
    sent: list[float] = []

    def terminate():  # the API's cancel: cancel_requested, then TerminateJob (SIGTERM) once the container runs
        deadline = time.monotonic() + 60
        while signal.getsignal(signal.SIGTERM) is previous and time.monotonic() < deadline:
            time.sleep(0.01)
        while aws.job("job_c7").get("status") != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_c7"}, "sk": {"S": "META"}},
                            UpdateExpression="SET cancel_requested = :t", ExpressionAttributeValues={":t": {"BOOL": True}})
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=terminate, daemon=True)
    timer.start()
    try:
        code, result = _run(aws, aws.envelope("job_c7", 1, spec, stage="container"), settings, control_hook=True)
    finally:
        timer.join(5)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert code == ExitCode.CANCELLED, result
    assert time.monotonic() - sent[0] < 15  # the preemption's grace alone would be 30 s
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_c7/"))
    assert b"cancel requested (after signal SIGTERM)" in logs, logs[-2000:]


def test_a_runtime_killed_outright_leaves_no_container_behind(moto_server, rt, oci, tmp_path):
    """The supervisor dies by SIGKILL (no handler runs): its reaper removes the tenant container at once."""
    import subprocess
    import sys

    import psutil

    endpoint, maws = moto_server
    marker = "gpufleet-orphan-marker"
    spec = {"workload": {"kind": "container", "image": oci.image,
                         "command": ["sh", "-c", f"while true; do sleep 0.2; done; : {marker}"]}}
    maws.put_job("job_c6", 1, spec)
    env = {**rt.child_env(endpoint, tmp_path / "cache", tmp_path / "state"), **oci.env,
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.runtime", "--envelope-json",
                             json.dumps(maws.envelope("job_c6", 1, spec, stage="container"))], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def tenant() -> list[int]:  # the container's processes (not the runtime or podman, whose argv name it too)
        found = []
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            if argv[:1] == ["sh"] and marker in " ".join(argv):
                found.append(p.pid)
        return found

    try:
        deadline = time.monotonic() + 60
        while not tenant():
            assert proc.poll() is None and time.monotonic() < deadline, "the container never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # the runtime and the podman client it started: no cleanup code runs
        proc.wait()
        t0 = time.monotonic()
        while tenant():
            assert time.monotonic() - t0 < 5, "the tenant container outlived its supervisor"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
def test_a_supervisor_dying_while_podman_creates_the_container_leaves_none_behind(oci, tmp_path, delay_s):
    """The worst moment to die: ``podman run`` has been started but the container does not exist yet (a
    remove now finds nothing). The reaper kills the in-flight client and removes what it made, however
    far it got; no container of that name is left running or created."""
    import subprocess

    from gpufleet.runtime import oci as ocimod

    name = f"gpufleet-reaper-race-{int(delay_s * 1000)}"
    spec = ocimod.ContainerSpec(name=name, image=oci.image, command=["sh", "-c", "sleep 300"], env={},
                                uid=1000, mounts=[])
    fd = oci.podman.start_reaper(name)
    proc = oci.podman.popen(*ocimod.run_argv(spec), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(delay_s)
        os.close(fd)  # the supervisor is gone (as on SIGKILL: the pipe's only write end closes)
        deadline = time.monotonic() + 30
        while proc.poll() is None or oci.podman.run("container", "exists", name, check=False).returncode == 0:
            assert time.monotonic() < deadline, "the container (or its podman run) outlived its supervisor"
            time.sleep(0.2)
        time.sleep(2)  # nothing comes back: a run that was still creating does not start it afterwards
        assert oci.podman.run("container", "exists", name, check=False).returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        oci.podman.remove(name)


def test_output_over_the_per_job_cap_is_a_user_error_and_nothing_is_uploaded(aws, settings):
    spec = {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1",
                         "command": ["sh", "-c", 'head -c 3000 /dev/zero > "$GPUFLEET_OUTPUT_DIR/big.bin"']}}
    aws.put_job("job_c4", 1, spec)
    envelope = aws.envelope("job_c4", 1, spec, stage="container")
    envelope["s3"].update(output_max_bytes=2048, output_max_files=10)
    code, result = _run(aws, envelope, settings())
    assert code == ExitCode.USER_ERROR, result
    assert "3000 bytes in 1 files" in result["detail"] and "2048 bytes" in result["detail"]
    assert aws.keys("bucket_outputs", "jobs/job_c4/") == [] and "generated" not in aws.job("job_c4")
    envelope["s3"].update(output_max_bytes=3000)  # at the cap: published
    code, result = _run(aws, envelope, settings("again"))
    assert code == ExitCode.SUCCEEDED, result
    assert aws.keys("bucket_outputs", "jobs/job_c4/") == ["jobs/job_c4/output/e0001/big.bin"]
    assert aws.job("job_c4")["generated"] == {**result["generated"], "files": 1, "bytes": 3000}


def test_a_crash_signal_records_the_fingerprint_of_the_last_lines_on_the_attempt(aws, settings):
    from gpufleet.store.jobs import get_attempt

    spec = {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1",
                         "command": ["sh", "-c", "echo loading at 0x7ffd1234; echo bad shape; kill -SEGV $$"]}}
    aws.put_job("job_c5", 1, spec)
    code, result = _run(aws, aws.envelope("job_c5", 1, spec, stage="container"), settings())
    assert code == ExitCode.SYSTEM_ERROR, result
    recorded = get_attempt(aws.ddb, aws.tables.jobs, "job_c5", 1)["crash"]
    assert recorded["exit_code"] == 139 and recorded["tail"] == ["loading at 0x?", "bad shape"]
    assert recorded["fingerprint"] == result["crash"]["fingerprint"]
