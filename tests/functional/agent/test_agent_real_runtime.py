"""The agent driving the real worker, ``python -m gpufleet.runtime`` (container stage, the tenant's image under
podman): a job completes its task token with the runtime's output; a drain checkpoints it and reports PREEMPTED;
a cancel ends the runtime and the container it started (a session of its own) within 5 s."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.slow

RUNTIME_ENV = {"GPUFLEET_CONTAINER_GRACE_S": "2", "GPUFLEET_LOG_FLUSH_S": "0.5", "GPUFLEET_PROGRESS_INTERVAL_S": "0.5"}


def _container(command: str, checkpoint: bool = False) -> dict:
    workload = {"kind": "container", "image": "localhost/gpufleet-test/tools:1", "command": ["sh", "-c", command]}
    if checkpoint:
        workload |= {"checkpoint_dir": "/ckpt-placeholder", "checkpoint_interval_s": 10}
    return {"workload": workload, "resources": {"gpus": 1}}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids_of(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
            out.append(p.info["pid"])
    return out


def test_real_runtime_success_drain_and_cancel(fleet, oci):
    # a site's child_env cannot change the node id the runtime tags its uploads with (the role checks that tag)
    a = fleet.agent("node-r", runtime_command=[sys.executable, "-m", "gpufleet.runtime"],
                    child_env={**RUNTIME_ENV, **oci.env, "GPUFLEET_NODE_ID": "node-other"})
    a.start()

    # success: the runtime's generated pointer travels in SendTaskSuccess
    fleet.submit("job-real-ok", spec=_container('echo hello > "$GPUFLEET_OUTPUT_DIR/out.txt"'))
    fleet.place("job-real-ok", "node-r", heartbeat_s=30)
    ok = fleet.wait_execution("job-real-ok", 1)
    assert ok["status"] == "SUCCEEDED", (ok, a.log.read_text()[-2000:])
    out = json.loads(ok["output"])
    assert out["epoch"] == 1 and out["generated"] == fleet.job("job-real-ok")["generated"] and out["generated"]
    keys = [o["Key"] for o in fleet.s3.list_objects_v2(Bucket=fleet.bucket, Prefix="jobs/job-real-ok/")["Contents"]]
    for key in keys:
        tags = fleet.s3.get_object_tagging(Bucket=fleet.bucket, Key=key)["TagSet"]
        assert {"Key": "gpufleet:node", "Value": "node-r"} in tags, (key, tags)

    # cancel: the user command (its own session, started by the runtime) is gone within 5 s
    marker = "gpufleet-agent-cancel-marker"
    fleet.submit("job-real-cancel", spec=_container(f"sleep 300; : {marker}"))
    fleet.place("job-real-cancel", "node-r", heartbeat_s=30)
    deadline = time.monotonic() + 60
    while not _pids_of(marker):
        assert time.monotonic() < deadline, a.log.read_text()[-2000:]
        time.sleep(0.1)
    shell = psutil.Process(_pids_of(marker)[0])
    command_pids = [shell.pid] + [c.pid for c in shell.children(recursive=True)]
    assert os.getsid(shell.pid) != os.getsid(a.proc.pid)  # the runtime gave the command a session of its own
    t0 = time.monotonic()
    fleet.cancel("job-real-cancel")
    while any(_alive(p) for p in command_pids):
        assert time.monotonic() - t0 < 5, "user command survived the cancel"
        time.sleep(0.05)
    c = fleet.wait_execution("job-real-cancel", 1)
    assert c["status"] == "FAILED" and c["error"] == "CANCELLED"

    # drain: SIGTERM → the runtime stops its command and exits PREEMPTED → reported PREEMPTED
    drain_marker = "gpufleet-agent-drain-marker"
    fleet.submit("job-real-drain", spec=_container(f"while true; do sleep 0.1; done; : {drain_marker}"))
    fleet.place("job-real-drain", "node-r", heartbeat_s=30)
    deadline = time.monotonic() + 60
    while not _pids_of(drain_marker):  # the runtime is up and running the command
        assert time.monotonic() < deadline, a.log.read_text()[-2000:]
        time.sleep(0.1)
    a.signal(signal.SIGTERM)
    assert a.wait(90) == 0
    d = fleet.wait_execution("job-real-drain", 1)
    assert d["status"] == "FAILED" and d["error"] == "PREEMPTED"
    ended = [r for r in a.log_lines() if r.get("msg") == "job ended" and r.get("job_id") == "job-real-drain"]
    assert ended[0]["returncode"] == 30  # the runtime's own PREEMPTED exit, not a kill
