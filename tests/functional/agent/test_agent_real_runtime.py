"""The agent driving the real worker, ``python -m gpufleet.runtime`` (container stage, the tenant's image under
podman): a job completes its task token with the runtime's output; a drain checkpoints it and reports PREEMPTED;
a cancel ends the container the runtime started (a session of its own) within 5 s, even a tenant that ignores
SIGTERM: the agent's cancel signal makes the runtime stop it with the short cancel grace and report CANCELLED itself,
before the agent's SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest
from tenant_procs import marked_pids

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


def test_real_runtime_success_drain_and_cancel(fleet, oci):
    # a site's child_env cannot change the node id the runtime tags its uploads with (the role checks that tag)
    # cancel_grace_s above the runtime's container cancel grace, as the defaults (5 s, 3 s) are, with room for a
    # loaded machine: the runtime's own stop (podman stop, then its report) must end before the agent's SIGKILL
    a = fleet.agent("node-r", runtime_command=[sys.executable, "-m", "gpufleet.runtime"], cancel_grace_s=8.0,
                    child_env={**RUNTIME_ENV, **oci.env, "GPUFLEET_NODE_ID": "node-other",
                               "GPUFLEET_CONTAINER_CANCEL_GRACE_S": "1"})
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

    # cancel: the user command (its own session, started by the runtime), which ignores SIGTERM, is gone within 5 s
    marker = "gpufleet-agent-cancel-marker"
    fleet.submit("job-real-cancel", spec=_container(f"trap '' TERM; while :; do sleep 0.2; done; : {marker}"))
    fleet.place("job-real-cancel", "node-r", heartbeat_s=30)
    deadline = time.monotonic() + 60
    while not marked_pids(marker, tenant_only=True):  # in the container, not the podman client naming it
        assert time.monotonic() < deadline, a.log.read_text()[-2000:]
        time.sleep(0.1)
    tenant = [psutil.Process(p) for p in marked_pids(marker, tenant_only=True)]
    command_pids = [p.pid for p in tenant] + [c.pid for p in tenant for c in p.children(recursive=True)]
    assert all(os.getsid(p) != os.getsid(a.proc.pid) for p in command_pids)  # a session of its own
    t0 = time.monotonic()
    fleet.cancel("job-real-cancel")
    while any(_alive(p) for p in command_pids):
        assert time.monotonic() - t0 < 5, "user command survived the cancel"
        time.sleep(0.05)
    c = fleet.wait_execution("job-real-cancel", 1)
    assert c["status"] == "FAILED" and c["error"] == "CANCELLED"
    # the runtime stopped the container itself (cancel grace 1 s) and exited CANCELLED (40) before the agent's
    # SIGKILL (8 s): a runtime taking the agent's stop for a drain would use the container grace (2 s here, 30 s by
    # default) and exit PREEMPTED, or be killed mid-stop and leave its container to the reaper
    ended = [json.loads(line) for line in a.log.read_text().splitlines()
             if '"job ended"' in line and "job-real-cancel" in line]
    assert [(e["returncode"], e["stop"]) for e in ended] == [(40, "cancelled")], ended

    # drain: SIGTERM → the runtime stops its command and exits PREEMPTED → reported PREEMPTED
    drain_marker = "gpufleet-agent-drain-marker"
    fleet.submit("job-real-drain", spec=_container(f"while true; do sleep 0.1; done; : {drain_marker}"))
    fleet.place("job-real-drain", "node-r", heartbeat_s=30)
    deadline = time.monotonic() + 60
    while not marked_pids(drain_marker):  # the runtime is up and running the command
        assert time.monotonic() < deadline, a.log.read_text()[-2000:]
        time.sleep(0.1)
    a.signal(signal.SIGTERM)
    assert a.wait(90) == 0
    d = fleet.wait_execution("job-real-drain", 1)
    assert d["status"] == "FAILED" and d["error"] == "PREEMPTED"
    ended = [r for r in a.log_lines() if r.get("msg") == "job ended" and r.get("job_id") == "job-real-drain"]
    assert ended[0]["returncode"] == 30  # the runtime's own PREEMPTED exit, not a kill
