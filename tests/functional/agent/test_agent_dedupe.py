"""The agent's message intake, in process against the moto server: redeliveries are deduplicated,
completed attempts are never run again, malformed or unrunnable messages are settled, and a second
agent on the same state dir refuses to start."""

from __future__ import annotations

import json
import os
import subprocess
import time

import boto3
import pytest

from gpufleet.clock import SystemClock
from gpufleet.errors import ConfigError
from onprem_agent.agent import Agent
from onprem_agent.settings import AgentSettings


def _agent(fleet, node: str, **overrides) -> Agent:
    settings = AgentSettings.model_validate({**fleet.agent(node).settings, "metrics_enabled": False, **overrides})
    kw = {"endpoint_url": fleet.endpoint, "region_name": "us-east-1"}
    return Agent(settings, clock=SystemClock(), environ=dict(os.environ), sqs=boto3.client("sqs", **kw),
                 node_api=fleet.node_api(node))


def _receive(agent: Agent, n: int = 1, timeout: float = 10.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += agent.queue.receive(n - len(got), 1, 30)
    assert len(got) == n, got
    return got


def _visible(fleet, node: str) -> int:
    attrs = fleet.sqs.get_queue_attributes(QueueUrl=fleet.node_queue(node), AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_redelivery_is_deduplicated_and_completed_attempts_are_dropped(fleet):
    agent = _agent(fleet, "node-d")
    fleet.submit("job-d1", STEPS=1)
    fleet.place("job-d1", "node-d", heartbeat_s=30)
    first = _receive(agent)[0]
    agent.accept(first)
    agent.accept(first)  # the same message again (visibility lapsed): held once, receipt refreshed
    assert list(agent._held) == [("job-d1", 1)]
    assert agent.metrics.registry.get_sample_value("gpufleet_agent_duplicate_messages_total", {"reason": "held"}) == 1

    # this node already completed (job-d2, 1): its redelivery is deleted, never held or run
    fleet.submit("job-d2", STEPS=1)
    fleet.place("job-d2", "node-d", heartbeat_s=30)
    agent.state.record_completed("job-d2", 1, "SUCCEEDED", time.time())
    msg = _receive(agent)[0]
    agent.accept(msg)
    assert ("job-d2", 1) not in agent._held
    assert agent.metrics.registry.get_sample_value("gpufleet_agent_duplicate_messages_total",
                                                   {"reason": "completed"}) == 1
    assert _visible(fleet, "node-d") == 1  # only job-d1's message is left


def test_malformed_and_unrunnable_messages_are_settled(fleet):
    agent = _agent(fleet, "node-m")
    # a placement naming a GPU this node does not have → SYSTEM_ERROR, message deleted
    fleet.submit("job-m1", STEPS=1)
    fleet.place("job-m1", "node-m", gpu_indices=[5], heartbeat_s=30)
    agent.accept(_receive(agent)[0])
    d = fleet.wait_execution("job-m1", 1)
    assert d["status"] == "FAILED" and d["error"] == "SYSTEM_ERROR"
    assert agent.state.completed("job-m1", 1) == "SYSTEM_ERROR"

    # not an envelope at all (an old-style message carrying a token) → settled as SYSTEM_ERROR, the message deleted
    fleet.sqs.send_message(QueueUrl=fleet.node_queue("node-m"), MessageBody=json.dumps({"task_token": "nope"}))
    agent.accept(_receive(agent)[0])
    assert agent.metrics.registry.get_sample_value("gpufleet_agent_jobs_total", {"outcome": "SYSTEM_ERROR"}) == 2
    assert _visible(fleet, "node-m") == 0 and agent._held == {}


def test_a_second_agent_on_the_same_state_dir_refuses_to_start(fleet):
    agent = _agent(fleet, "node-s")
    other = subprocess.Popen(["sleep", "30"])  # stands in for the live agent process
    try:
        agent.state.write_agent_pid(other.pid)
        with pytest.raises(ConfigError, match="another agent"):
            _agent(fleet, "node-s").start()
        assert agent.state.live_agent_pid() == other.pid
    finally:
        other.kill()
        other.wait()
    assert agent.state.live_agent_pid() is None  # a dead pid no longer blocks a start
