"""SIGTERM drain (no job lost, none run twice), second SIGTERM, and cancellation within 5 s."""

from __future__ import annotations

import signal
import time

import pytest
from agent_procs import wait_gone

from gpufleet.store.fencing import issue_epoch

pytestmark = pytest.mark.slow


def test_sigterm_drain_checkpoints_reports_preempted_and_releases_unstarted_messages(fleet):
    a = fleet.agent("node-a").start()
    b = fleet.agent("node-b").start()
    fleet.submit("job-run", STEPS=30, STEP_S=0.05, CKPT_EVERY=100, HOLD_AT=10)  # still running when SIGTERM comes
    fleet.submit("job-wait", STEPS=3, STEP_S=0.05)
    fleet.place("job-run", "node-a", heartbeat_s=15)
    fleet.wait_event("job-run", "step", step=3, epoch=1)
    fleet.place("job-wait", "node-a", heartbeat_s=30)  # node-a's one slot is busy: held, not started
    a.wait_log("message accepted", timeout=60, job_id="job-wait")
    a.signal(signal.SIGTERM)
    assert a.wait(90) == 0

    run1 = fleet.wait_execution("job-run", 1)
    assert run1["status"] == "FAILED" and run1["error"] == "PREEMPTED"
    preempted = fleet.wait_event("job-run", "preempted", epoch=1)
    assert any(r.get("msg") == "released unstarted message" and r["job_id"] == "job-wait" for r in a.log_lines())
    node = fleet.node_item("node-a")
    assert node["draining"] is True and node["expires_at"] <= time.time() + 1
    assert fleet.events("job-wait") == []  # never started on the draining node

    # node-a comes back (after an upgrade, say) and picks up the released message.
    a.start()
    # The lifecycle reschedules the preempted job on node-b: it resumes exactly where it stopped.
    fleet.place("job-run", "node-b")
    assert fleet.wait_execution("job-run", 2)["status"] == "SUCCEEDED"
    steps = [(r["epoch"], r["step"]) for r in fleet.events("job-run", "step")]
    assert sorted(s for _, s in steps) == list(range(30))  # every step exactly once
    assert fleet.events("job-run", "start")[1]["step"] == preempted["step"]

    assert fleet.wait_execution("job-wait", 1)["status"] == "SUCCEEDED"
    assert sorted(r["step"] for r in fleet.events("job-wait", "step")) == [0, 1, 2]
    assert b.proc.poll() is None


def test_second_sigterm_exits_at_once_and_kills_the_jobs(fleet):
    a = fleet.agent("node-a", drain_timeout_s=120).start()
    fleet.submit("job-stubborn", STEPS=400, STEP_S=0.1, IGNORE_TERM=1)
    fleet.place("job-stubborn", "node-a", heartbeat_s=15)
    started = fleet.wait_event("job-stubborn", "workload_started")
    a.signal(signal.SIGTERM)
    a.wait_log("signal received: draining")
    time.sleep(1.0)
    assert a.proc.poll() is None  # still draining: the job ignores SIGTERM
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait(5) == 1
    assert time.monotonic() - t0 < 2
    wait_gone([started["pid"]], timeout=5)


def test_cancel_ends_the_whole_process_group_within_5_seconds_and_a_newer_epoch_fences(fleet):
    a = fleet.agent("node-a").start()
    fleet.submit("job-c", STEPS=400, STEP_S=0.1, GRANDCHILD=1, IGNORE_TERM=1)
    fleet.place("job-c", "node-a", heartbeat_s=15)
    gc = fleet.wait_event("job-c", "grandchild")
    fleet.wait_event("job-c", "workload_started")
    t0 = time.monotonic()
    fleet.cancel("job-c")
    elapsed = wait_gone([gc["pid"], gc["grandchild_pid"]], timeout=5)
    assert elapsed < 5
    d = fleet.wait_execution("job-c", 1)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED"
    assert time.monotonic() - t0 < 8
    assert a.proc.poll() is None
    ended = [r for r in a.log_lines() if r.get("msg") == "job ended"]
    assert ended[-1]["outcome"] == "CANCELLED" and ended[-1]["stop"] == "cancelled"
    # the slot is free again and the node says so at its next heartbeat
    deadline = time.monotonic() + 15
    while fleet.node_item("node-a")["gpus"][0]["milli_free"] != 1000:
        assert time.monotonic() < deadline, fleet.node_item("node-a")
        time.sleep(0.1)

    # A newer epoch (the control plane moved on to another attempt) fences the running job off.
    fleet.submit("job-f", STEPS=400, STEP_S=0.1, IGNORE_TERM=1)
    fleet.place("job-f", "node-a", heartbeat_s=5)
    started = fleet.wait_event("job-f", "workload_started")
    issue_epoch(fleet.ddb, fleet.tables.jobs, "job-f", 1)
    wait_gone([started["pid"]], timeout=15)  # SIGKILL at the next heartbeat
    ended = a.wait_log("job ended", job_id="job-f")
    assert ended["outcome"] == "FENCED" and ended["stop"] == "fenced"
    # A fenced-off attempt is no longer the node's to report: the node API refuses the stale epoch (409), so
    # the old Run task is not answered by the node and ends by its heartbeat timeout.
    a.wait_log("outcome not accepted: the attempt is no longer this node's to report", job_id="job-f")
    assert fleet.wait_execution("job-f", 1)["error"] in ("States.Timeout", "States.HeartbeatTimeout")
    assert a.proc.poll() is None



def test_a_job_past_its_max_run_seconds_is_stopped_by_the_agent_and_reported_timed_out(fleet):
    a = fleet.agent("node-a").start()
    cfg = {"RECORD_FILE": str(fleet.records), "STEPS": "400", "STEP_S": "0.1", "IGNORE_TERM": "1"}
    fleet.submit("job-t", {"workload": {"kind": "container", "image": "contract-runtime", "command": ["run"],
                                        "env": cfg},
                           "resources": {"gpus": 1}, "max_run_seconds": 4})
    fleet.place("job-t", "node-a", heartbeat_s=15)
    # the worker would step for 40 s and ignores SIGTERM: the agent's SIGKILL after cancel_grace_s ends it
    d = fleet.wait_execution("job-t", 1)
    assert d["status"] == "FAILED" and d["error"] == "TIMED_OUT", d
    ended = a.wait_log("job ended", job_id="job-t")
    assert ended["outcome"] == "TIMED_OUT" and ended["stop"] == "timed_out"
    assert ended["run_s"] < 40  # stopped, not run to its end
    pids = [e["pid"] for e in fleet.events("job-t") if "pid" in e]
    wait_gone(pids[:1], timeout=5)
    assert a.proc.poll() is None
