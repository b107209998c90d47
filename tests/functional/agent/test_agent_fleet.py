"""Two agents on one machine against moto: placement on both, crash isolation."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_jobs_land_on_both_agents_and_complete_their_task_tokens(fleet):
    a = fleet.agent("node-a").start()
    b = fleet.agent("node-b").start()
    jobs = {"job-a1": "node-a", "job-b1": "node-b", "job-a2": "node-a", "job-b2": "node-b"}
    for job_id, node in jobs.items():
        fleet.submit(job_id, STEPS=4, STEP_S=0.05)
        fleet.place(job_id, node)
    for job_id in jobs:
        d = fleet.wait_execution(job_id, 1)
        assert d["status"] == "SUCCEEDED", d
        out = json.loads(d["output"])
        assert out["epoch"] == 1 and out["gpu_seconds"] > 0
        assert out["generated"]["key"] == f"jobs/{job_id}/generated.json"
    ran_on = {r["job"]: r for r in fleet.events(event="done")}
    assert set(ran_on) == set(jobs)
    # each job's steps ran exactly once, in the agent of the node it was placed on
    for job_id in jobs:
        assert sorted(r["step"] for r in fleet.events(job_id, "step")) == [0, 1, 2, 3]
    for agent in (a, b):
        node = fleet.node_item(agent.node)
        assert node["pool"] == "onprem-test" and node["accelerator"] == "cpu" and not node["draining"]
        assert node["gpus"] == [{"index": 0, "memory_gb": 0, "milli_free": 1000}] or node["running_jobs"] > 0
        assert node["labels"] == {"site": "test"}
        started = [r for r in agent.log_lines() if r.get("msg") == "job started"]
        assert {r["job_id"] for r in started} == {j for j, n in jobs.items() if n == agent.node}


def test_a_crashing_job_does_not_take_the_agent_down(fleet):
    a = fleet.agent("node-a").start()
    fleet.submit("job-crash", STEPS=5, CRASH_AT=1)
    fleet.submit("job-next", STEPS=2)
    fleet.place("job-crash", "node-a")
    fleet.place("job-next", "node-a")
    crashed = fleet.wait_execution("job-crash", 1)
    assert crashed["status"] == "FAILED" and crashed["error"] == "SYSTEM_ERROR"
    assert fleet.wait_execution("job-next", 1)["status"] == "SUCCEEDED"
    assert a.proc.poll() is None
    ended = [r for r in a.log_lines() if r.get("msg") == "job ended" and r["job_id"] == "job-crash"]
    assert ended and ended[0]["returncode"] == -11 and ended[0]["outcome"] == "SYSTEM_ERROR"
