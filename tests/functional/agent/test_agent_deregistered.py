"""A node an operator deregisters (with force) while it runs a job, with a real agent against moto: once the node
API refuses the node (its registration gone; attempt calls within the node API's registration cache), the agent
stops the job at its next task heartbeat and reports nothing (the attempt ends at its Run state's heartbeat timeout
and the lifecycle places it again), keeps running, and its node heartbeats are refused — they cannot bring the
node back into the scheduler's view."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from agent_procs import wait_gone

from gpufleet.clock import SystemClock, iso
from gpufleet.nodeapi.liveness import Registration
from gpufleet.nodeapi.registered import REGISTRATION_TTL_S
from gpufleet.store.admin import AuditRecord, DynamoAdminStore

pytestmark = pytest.mark.slow


def test_a_forced_deregistration_stops_the_nodes_running_job_and_the_node_reports_nothing(fleet):
    a = fleet.agent("node-a").start()
    fleet.submit("job-d", STEPS=400, STEP_S=0.1)
    fleet.place("job-d", "node-a", heartbeat_s=60)
    started = fleet.wait_event("job-d", "workload_started")
    assert fleet.node_item("node-a")["node_id"] == "node-a"

    now = SystemClock().now()
    DynamoAdminStore(fleet.ddb, fleet.tables.control).deregister(
        "node-a", AuditRecord(at=iso(now), id=uuid.uuid4().hex, actor="arn:aws:iam::123456789012:user/op",
                              action="node.deregister", target="registration node-a"),
        expected_version=0, purge_at=int(now) + 86_400)
    t0 = time.monotonic()
    # the registration cache's bound, a task heartbeat (0.5 s) and the stop
    assert wait_gone([started["pid"]], timeout=REGISTRATION_TTL_S + 10) < REGISTRATION_TTL_S + 10
    ended = a.wait_log("job ended", job_id="job-d")
    # whichever is refused first stops it: the agent's task heartbeat (it kills the job: abandoned) or the runtime's
    # own node API call (it exits by itself, and the agent's report of that is refused in turn)
    assert ended["stop"] in ("abandoned", "none"), ended
    assert time.monotonic() - t0 < REGISTRATION_TTL_S + 10
    a.wait_log("node heartbeat failed")  # refused, and logged
    refused = [r for r in a.log_lines() if r.get("msg") == "node heartbeat failed"]
    assert any("deregistered" in r["detail"] or "not registered" in r["detail"] for r in refused), refused[-1]
    said = a.wait_log("node not registered: the node API refuses every call of this node (deregistered by an "
                      "operator?); stop the agent, or have the node registered again")
    assert said["level"] == "ERROR"
    port = next(r for r in a.log_lines() if r.get("msg") == "agent started")["metrics_port"]
    assert "gpufleet_agent_registered 0.0" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert a.proc.poll() is None  # the agent lives on (an operator may register the node again)
    assert fleet.execution("job-d", 1)["status"] == "RUNNING"  # nothing reported: its heartbeat timeout ends it
    item = fleet.node_item("node-a")
    assert item["deregistered_at"] and item["draining"] is True and "gsi2pk" not in item  # still the tombstone

    # an operator registers it again: the next heartbeat lands, the agent says so once and the gauge is back
    time.sleep(2.5)  # a couple more refused heartbeats: the error above is said once, not per heartbeat
    fleet.nodes.register(Registration(node_id="node-a", pool="onprem-test", site="test", gpus=1,
                                      queue_url=fleet.node_queue("node-a"), registered_by="fleet",
                                      registered_at=iso(SystemClock().now())))
    a.wait_log("node registered again: the node API accepts its heartbeats")
    lines = [r.get("msg") for r in a.log_lines()]
    assert lines.count("node heartbeat failed") >= 2 and sum("node not registered" in (m or "") for m in lines) == 1
    assert "gpufleet_agent_registered 1.0" in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "deregistered_at" not in fleet.node_item("node-a")
