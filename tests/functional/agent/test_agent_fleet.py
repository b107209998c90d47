"""Two agents on one machine against moto: jobs land on both, task tokens are completed,
a crashing job does not take its agent down, metrics and the node item tell the truth."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
import requests

pytestmark = pytest.mark.slow


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name}{labels} not in metrics"
    return float(m.group(1))


def _settled_metrics(port: int, finished: int, timeout: float = 30) -> str:
    """The agent's exposition once ``finished`` jobs are counted: the workflow sees a job's outcome when the
    report lands, a moment before the agent settles the job (records it, deletes the message, counts it)."""
    deadline = time.monotonic() + timeout
    while True:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        counted = sum(float(v) for v in re.findall(r"^gpufleet_agent_jobs_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M))
        if counted >= finished or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_jobs_land_on_both_agents_and_a_crash_is_contained(fleet):
    a = fleet.agent("node-a").start()
    b = fleet.agent("node-b").start()
    fleet.submit("job-a1", STEPS=3)
    fleet.submit("job-crash", STEPS=5, CRASH_AT=1)
    fleet.submit("job-b2", STEPS=3)
    # 15 s heartbeats: job-b2 waits on node-b behind job-crash, and a loaded host may start a worker slowly;
    # this test is about where jobs land and that a crash stays contained, not about heartbeat timing
    fleet.place("job-a1", "node-a", heartbeat_s=15)
    fleet.place("job-crash", "node-b", heartbeat_s=15)
    fleet.place("job-b2", "node-b", heartbeat_s=15)

    for job_id, node in (("job-a1", "node-a"), ("job-b2", "node-b")):
        d = fleet.wait_execution(job_id, 1)
        assert d["status"] == "SUCCEEDED", {job_id: {k: d.get(k) for k in ("status", "error", "cause")}}
        out = json.loads(d["output"])
        assert out["epoch"] == 1 and out["gpu_seconds"] > 0
        assert out["generated"]["key"] == f"jobs/{job_id}/generated.json"
        assert sorted(r["step"] for r in fleet.events(job_id, "step")) == [0, 1, 2]
        started = [r for r in (a if node == "node-a" else b).log_lines() if r.get("msg") == "job started"]
        assert job_id in {r["job_id"] for r in started}

    crashed = fleet.wait_execution("job-crash", 1)
    assert crashed["status"] == "FAILED" and crashed["error"] == "SYSTEM_ERROR"
    assert b.proc.poll() is None and a.proc.poll() is None
    ended = [r for r in b.log_lines() if r.get("msg") == "job ended" and r.get("job_id") == "job-crash"]
    assert ended and ended[0]["returncode"] == -11 and ended[0]["outcome"] == "SYSTEM_ERROR"

    # The node item the scheduler reads: capacity, labels, liveness.
    for agent in (a, b):
        node = fleet.node_item(agent.node)
        assert node["pool"] == "onprem-test" and node["accelerator"] == "cpu" and node["draining"] is False
        assert node["labels"] == {"site": "test"} and node["queue_url"] == fleet.node_queue(agent.node)
        assert [g["index"] for g in node["gpus"]] == [0]
        assert node["expires_at"] > 0 and node["heartbeat_at"].endswith("Z")

    # Prometheus on localhost: outcomes, queue wait, run time, idle gap.
    port = next(r for r in b.log_lines() if r.get("msg") == "agent started")["metrics_port"]
    text = _settled_metrics(port, finished=2)
    assert _metric(text, "gpufleet_agent_jobs_total", '{outcome="SUCCEEDED"}') == 1
    assert _metric(text, "gpufleet_agent_jobs_total", '{outcome="SYSTEM_ERROR"}') == 1
    assert _metric(text, "gpufleet_agent_queue_wait_seconds_count") == 2
    assert _metric(text, "gpufleet_agent_job_run_seconds_count") == 2
    assert _metric(text, "gpufleet_agent_gpu_idle_gap_seconds_count") == 1  # between the two jobs on slot 0
    assert _metric(text, "gpufleet_agent_running_jobs") == 0
    assert "gpufleet_agent_cache_hits_total" in text


def promtool_check(text: str) -> tuple[int, str]:
    """``promtool check metrics`` (the distribution's package) on an exposition: (exit status, its output)."""
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is not installed (make tools installs the distribution's prometheus package)")
def test_the_agents_prometheus_endpoint_passes_promtool(fleet):
    """A running agent's /metrics, scraped over HTTP, passes promtool's lint; the lint can fail (a control)."""
    a = fleet.agent("node-p").start()
    port = a.wait_log("agent started")["metrics_port"]
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "gpufleet_agent_free_gpus" in text and "gpufleet_agent_cache_hits_total" in text
    rc, out = promtool_check(text)
    assert rc == 0, out
    rc, out = promtool_check("# HELP gpufleet_agent_x a counter without its suffix\n# TYPE gpufleet_agent_x counter\n"
                             "gpufleet_agent_x 1\n")
    assert rc != 0 and "_total" in out
