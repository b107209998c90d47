"""A two-node gang on two real agents (the contract runtime as the worker): each member runs on its own node
with its rank, the world size and the rendezvous of the attempt; both must succeed for the attempt to succeed,
billed for both members. Killing one member's agent mid-run ends the other member (the node API fails the
silent gang, the other agent's next heartbeat is 410 and it kills its worker), and the next epoch runs the
gang again as a unit."""

from __future__ import annotations

import json
import time

STEPS = {"STEPS": "200", "STEP_S": "0.05", "CKPT_EVERY": "20"}


def _spec(fleet, **cfg) -> dict:
    env = {"RECORD_FILE": str(fleet.records), **{k: str(v) for k, v in cfg.items()}}
    return {"workload": {"kind": "container", "image": "contract-runtime", "command": ["run"], "env": env},
            "resources": {"gpus": 1, "nodes": 2}}


def _starts(fleet, job_id: str, epoch: int, n: int = 2, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = [r for r in fleet.events(job_id, "start") if r["epoch"] == epoch]
        if len(starts) >= n:
            return starts
        time.sleep(0.05)
    raise AssertionError(f"{job_id}@{epoch}: {len(starts)} of {n} members started")


def test_a_two_node_gang_runs_one_member_per_node_and_succeeds_when_both_do(fleet):
    a, b = fleet.agent("ga").start(), fleet.agent("gb").start()
    fleet.submit("job_gang", spec=_spec(fleet, STEPS=10))
    epoch = fleet.place("job_gang", "ga", gang=["ga", "gb"])
    starts = _starts(fleet, "job_gang", epoch)
    dists = sorted((s["dist"] for s in starts), key=lambda d: d["RANK"])
    assert [d["RANK"] for d in dists] == ["0", "1"] and {d["WORLD_SIZE"] for d in dists} == {"2"}
    assert {d["MASTER_ADDR"] for d in dists} == {"ga"} and len({d["MASTER_PORT"] for d in dists}) == 1
    d = fleet.wait_execution("job_gang", epoch)
    assert d["status"] == "SUCCEEDED", d
    assert json.loads(d["output"])["gpu_seconds"] > 0
    a.wait_log("job ended", outcome="SUCCEEDED"), b.wait_log("job ended", outcome="SUCCEEDED")


def test_killing_one_members_agent_ends_the_other_and_the_next_epoch_runs_the_gang_again(fleet):
    a, b = fleet.agent("ka").start(), fleet.agent("kb").start()
    fleet.submit("job_gk", spec=_spec(fleet, **STEPS))
    epoch = fleet.place("job_gk", "ka", gang=["ka", "kb"])
    _starts(fleet, "job_gk", epoch)
    b.kill9()  # member 1's agent dies mid-run (its worker gets SIGTERM through PDEATHSIG)
    d = fleet.wait_execution("job_gk", epoch)
    assert d["status"] == "FAILED"
    a.wait_log("task gone while running; stopping the job")
    a.wait_log("job ended", stop="abandoned")
    b = fleet.agent("kb").start()  # the node comes back; the lifecycle retries the gang as a unit
    # a 15 s heartbeat: this attempt must succeed, and a restarted agent on a loaded host may be silent for 3 s
    epoch2 = fleet.place("job_gk", "ka", gang=["ka", "kb"], heartbeat_s=15)
    assert epoch2 == epoch + 1
    assert {s["dist"]["RANK"] for s in _starts(fleet, "job_gk", epoch2)} == {"0", "1"}
    d2 = fleet.wait_execution("job_gk", epoch2)
    assert d2["status"] == "SUCCEEDED", {k: d2.get(k) for k in ("status", "error", "cause")}
