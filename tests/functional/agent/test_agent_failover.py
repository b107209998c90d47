"""kill -9 of an agent mid-job: the job finishes elsewhere from its checkpoint, billed once;
a restarted agent cleans up the orphaned process group and runs nothing twice."""

from __future__ import annotations

import json
import time

import pytest
from agent_procs import gone, wait_gone

from gpufleet.clock import iso
from gpufleet.errors import StaleEpoch
from gpufleet.lifecycle.billing import Outcome, charge_for
from gpufleet.store import ledger

pytestmark = pytest.mark.slow


def _bill(fleet, job_id: str, epoch: int, output: dict) -> bool:
    """The lifecycle's Bill step for a successful attempt (fenced on the epoch, written once)."""
    job = fleet.job(job_id)
    charge = charge_for(Outcome.SUCCEEDED, output["gpu_seconds"], 1.0)
    return ledger.record(fleet.ddb, fleet.tables.jobs, fleet.tables.ledger, job, epoch, charge,
                         pool="onprem-test", price=1.0, at=iso(time.time()))


def test_kill9_mid_job_finishes_on_the_other_agent_from_its_checkpoint_billed_once(fleet):
    a = fleet.agent("node-a").start()
    b = fleet.agent("node-b").start()
    fleet.submit("job-k", STEPS=30, STEP_S=0.05, CKPT_EVERY=5)
    fleet.place("job-k", "node-a")
    fleet.wait_event("job-k", "checkpoint", step=5, epoch=1)
    a.kill9()
    # The kernel tells the orphaned worker its agent died (PR_SET_PDEATHSIG): it checkpoints and stops.
    orphan = fleet.wait_event("job-k", "preempted", epoch=1, timeout=60)

    # The workflow hears nothing more from node-a: the task heartbeat times out.
    first = fleet.wait_execution("job-k", 1)
    assert first["status"] == "FAILED" and first["error"] in ("States.Timeout", "States.HeartbeatTimeout")

    # Retry: a new epoch, placed on node-b.
    fleet.place("job-k", "node-b")
    second = fleet.wait_execution("job-k", 2)
    assert second["status"] == "SUCCEEDED", second
    out = json.loads(second["output"])
    assert out["epoch"] == 2

    resumed = fleet.events("job-k", "start")
    assert [r["epoch"] for r in resumed] == [1, 2]
    assert resumed[1]["step"] == orphan["step"] >= 5  # resumed from the orphan's last checkpoint
    assert [r["epoch"] for r in fleet.events("job-k", "done")] == [2]
    steps = sorted(r["step"] for r in fleet.events("job-k", "step"))
    assert steps == list(range(30))  # every step ran exactly once across the two nodes
    assert fleet.job("job-k")["progress"] == {"step": 30, "total": 30}
    assert b.proc.poll() is None

    # Billed once: the successful attempt's ledger entry lands once; a retried Bill is a no-op,
    # and the dead attempt (epoch 1) cannot bill at all.
    assert _bill(fleet, "job-k", 2, out) is True
    assert _bill(fleet, "job-k", 2, out) is False
    with pytest.raises(StaleEpoch):
        _bill(fleet, "job-k", 1, {"gpu_seconds": 1.0})
    entries = ledger.entries(fleet.ddb, fleet.tables.ledger, "job-k")
    assert [e["epoch"] for e in entries] == [2]
    assert entries[0]["gpu_seconds"] >= out["gpu_seconds"] > 0  # the agent-reported time, rounded up by policy

    # node-a comes back: its redelivered epoch-1 message is stale and is dropped, not run.
    a.start()
    a.wait_log("stale message dropped", timeout=60)
    time.sleep(0.5)
    assert [r["epoch"] for r in fleet.events("job-k", "start")] == [1, 2]


def test_restart_after_kill9_kills_the_orphaned_process_group_and_runs_nothing_twice(fleet):
    a = fleet.agent("node-a").start()
    # A worker that ignores SIGTERM survives its agent's death (and so does its grandchild).
    fleet.submit("job-o", STEPS=100, STEP_S=0.1, CKPT_EVERY=5, GRANDCHILD=1, IGNORE_TERM=1)
    fleet.place("job-o", "node-a")
    grandchild = fleet.wait_event("job-o", "grandchild", epoch=1)
    fleet.wait_event("job-o", "checkpoint", step=5, epoch=1)
    child_pid, grandchild_pid = grandchild["pid"], grandchild["grandchild_pid"]
    a.kill9()
    assert not gone(child_pid) and not gone(grandchild_pid)  # kill -9 of the agent leaves them running

    a.start()
    orphan_log = a.wait_log("cleaned up orphaned job", timeout=60)
    assert orphan_log["job_id"] == "job-o" and orphan_log["epoch"] == 1
    wait_gone([child_pid, grandchild_pid], timeout=5)

    # The attempt's token timed out while the agent was down; the redelivered message is not run again.
    assert fleet.wait_execution("job-o", 1)["status"] == "FAILED"
    a.wait_log("task token no longer valid; not running", timeout=60)
    assert len(fleet.events("job-o", "start")) == 1
    assert fleet.events("job-o", "done") == []
    assert a.proc.poll() is None
