"""A cancel reaches an on-prem job through the node's signal queue within about a second, not at the agent's next
heartbeat: real agent processes with a 30 s heartbeat, the cancel propagated as the API's DELETE does
(:func:`gpufleet.lifecycle.cancel.propagate` with :class:`gpufleet.store.queues.SqsNodeSignals`).

- a running job: stopped and reported CANCELLED within 5 s of the cancel (without the nudge: up to 30 s);
- a held message (the node's one GPU busy): reported CANCELLED at once, without waiting for the GPU;
- a nudge carries no authority: one naming a job that was not cancelled changes nothing (the node API's heartbeat
  answer decides), and one for an attempt the node does not hold is ignored;
- a node without a signal queue (onboarded before them) still sees the cancel at its next heartbeat, and finds the
  queue once it is created (re-registration), without a restart.
"""

from __future__ import annotations

import os
import time

import boto3
import pytest
from agent_procs import wait_gone

from gpufleet.clock import SystemClock
from gpufleet.envelope import Envelope
from gpufleet.lifecycle.cancel import propagate
from gpufleet.store.queues import SqsNodeSignals, signals_url
from onprem_agent.agent import Agent
from onprem_agent.runner import request_for
from onprem_agent.settings import AgentSettings

pytestmark = pytest.mark.slow

SLOW_BEAT = {"heartbeat_interval_s": 30.0, "visibility_timeout_s": 60}


def _signal_queue(fleet, node: str) -> str:
    name = fleet.node_queue(node).rsplit("/", 1)[-1]
    return fleet.sqs.create_queue(QueueName=name + "_signals")["QueueUrl"]


def _cancel(fleet, job_id: str, epoch: int, node: str) -> dict:
    """The API's DELETE: cancel_requested, then propagate over the job item (its placement names the node)."""
    fleet.cancel(job_id)
    item = {**fleet.job(job_id), "status": "RUNNING",
            "placement": {"target": "onprem", "epoch": epoch, "pool": "onprem-test", "node": node,
                          "queue_url": fleet.node_queue(node)}}
    return propagate(item, signals=SqsNodeSignals(fleet.sqs))


def test_a_cancel_nudge_stops_a_running_job_in_seconds_and_a_nudge_alone_changes_nothing(fleet):
    assert signals_url(fleet.node_queue("node-n")) == _signal_queue(fleet, "node-n")
    a = fleet.agent("node-n", **SLOW_BEAT).start()
    fleet.submit("job-run", STEPS=400, STEP_S=0.1)
    e_run = fleet.place("job-run", "node-n", heartbeat_s=120)
    started = fleet.wait_event("job-run", "workload_started")

    # a nudge for a job nobody cancelled, and one for an attempt this node does not hold: nothing happens
    SqsNodeSignals(fleet.sqs).nudge(fleet.node_queue("node-n"), "job-run", e_run)
    SqsNodeSignals(fleet.sqs).nudge(fleet.node_queue("node-n"), "job-elsewhere", 1)
    time.sleep(2)
    assert fleet.execution("job-run", e_run)["status"] == "RUNNING"
    assert not [r for r in a.log_lines() if r.get("msg") == "job ended"]

    t0 = time.monotonic()
    done = _cancel(fleet, "job-run", e_run, "node-n")
    assert done["actions"][-1].startswith("node_nudged:"), done
    assert wait_gone([started["pid"]], timeout=5) < 5
    d = fleet.wait_execution("job-run", e_run, timeout=10)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED"
    assert time.monotonic() - t0 < 5  # the agent's own heartbeat would have come up to 30 s later
    ended = a.wait_log("job ended", job_id="job-run")
    assert ended["outcome"] == "CANCELLED" and a.proc.poll() is None
    nudges = [(r["job_id"], r["target"]) for r in a.log_lines() if r.get("msg") == "cancel nudge"]
    assert nudges == [("job-run", "running"), ("job-elsewhere", "unknown"), ("job-run", "running")], nudges


def test_a_held_message_is_cancelled_without_waiting_for_the_gpu(fleet):
    _signal_queue(fleet, "node-h")
    a = fleet.agent("node-h", **SLOW_BEAT).start()
    fleet.submit("job-busy", STEPS=400, STEP_S=0.1)
    e_busy = fleet.place("job-busy", "node-h", heartbeat_s=120)
    fleet.wait_event("job-busy", "workload_started")
    fleet.submit("job-wait", STEPS=3, STEP_S=0.05)
    e_wait = fleet.place("job-wait", "node-h", heartbeat_s=120)
    a.wait_log("message accepted", job_id="job-wait")
    t0 = time.monotonic()
    _cancel(fleet, "job-wait", e_wait, "node-h")
    d = fleet.wait_execution("job-wait", e_wait, timeout=10)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED"
    assert time.monotonic() - t0 < 5
    assert fleet.events("job-wait") == []  # never started
    a.wait_log("held message cancelled before start", job_id="job-wait")
    assert fleet.execution("job-busy", e_busy)["status"] == "RUNNING"  # its neighbour runs on


def test_without_a_signal_queue_the_cancel_waits_for_the_heartbeat(fleet):
    a = fleet.agent("node-q", heartbeat_interval_s=2.0, visibility_timeout_s=10, signals_recheck_s=1.0).start()
    a.wait_log("no signal queue for this node; cancels are seen at the next heartbeat")
    fleet.submit("job-q", STEPS=400, STEP_S=0.1)
    epoch = fleet.place("job-q", "node-q", heartbeat_s=30)
    fleet.wait_event("job-q", "workload_started")
    done = _cancel(fleet, "job-q", epoch, "node-q")
    assert done["actions"][-1] == "node_nudge_failed", done
    d = fleet.wait_execution("job-q", epoch, timeout=15)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED"
    # the node is re-registered later (its signal queue created): the agent finds it without a restart
    _signal_queue(fleet, "node-q")
    a.wait_log("signal queue found; cancel nudges on", timeout=15)
    assert [r["msg"] for r in a.log_lines()].count("no signal queue for this node; cancels are seen at the next "
                                                    "heartbeat") == 1  # looked for every second, logged once
    fleet.submit("job-q2", STEPS=400, STEP_S=0.1)
    epoch = fleet.place("job-q2", "node-q", heartbeat_s=30)
    fleet.wait_event("job-q2", "workload_started")
    t0 = time.monotonic()
    done = _cancel(fleet, "job-q2", epoch, "node-q")
    assert done["actions"][-1].startswith("node_nudged:"), done
    a.wait_log("cancel nudge", timeout=10, job_id="job-q2", target="running")  # read off the queue it found
    d = fleet.wait_execution("job-q2", epoch, timeout=10)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED" and time.monotonic() - t0 < 5


def test_the_nudge_metric_counts_what_each_nudge_named(fleet):
    """``gpufleet_agent_cancel_nudges_total{target}``, in process: a nudge for a held message (cancelled: it is then
    settled without GPUs) counts ``held``, one for an attempt the agent does not have counts ``unknown``."""
    settings = AgentSettings.model_validate({**fleet.agent("node-m").settings, "metrics_enabled": False})
    agent = Agent(settings, clock=SystemClock(), environ=dict(os.environ),
                  sqs=boto3.client("sqs", endpoint_url=fleet.endpoint, region_name="us-east-1"),
                  node_api=fleet.node_api("node-m"))
    fleet.submit("job-m", STEPS=3, STEP_S=0.05)
    epoch = fleet.place("job-m", "node-m", heartbeat_s=120)
    msgs = []
    deadline = time.monotonic() + 15
    while not msgs and time.monotonic() < deadline:
        msgs = agent.queue.receive(1, 1, 30)
    agent.slots.acquire("busy@0", request_for(Envelope.model_validate_json(msgs[0].body)))  # held, not started
    agent.accept(msgs[0])
    fleet.cancel("job-m")

    def count(target: str) -> float:
        return agent.metrics.registry.get_sample_value("gpufleet_agent_cancel_nudges_total", {"target": target}) or 0.0

    agent.nudge(("job-m", epoch))
    agent.nudge(("job-gone", 1))
    assert (count("held"), count("unknown"), count("running")) == (1.0, 1.0, 0.0)
    d = fleet.wait_execution("job-m", epoch, timeout=10)
    assert d["status"] == "FAILED" and d["error"] == "CANCELLED" and ("job-m", epoch) not in agent._held
