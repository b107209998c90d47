"""Benchmark: how long an on-prem cancel takes to stop the job, with and without the node's signal queue, in one run.

Everything is real except AWS, which is a moto server on 127.0.0.1 (a separate process): the agent tests' control
plane (``tests/functional/agent/conftest.py``: node API behind a SigV4 gateway, a Run state machine, the dispatch
step) and one agent process per mode (`python -m onprem_agent`, one slot) at the agent's default
``heartbeat_interval_s`` (10 s), running the agent tests' contract runtime (a job that steps every 0.1 s until
stopped). Each job is cancelled as the API's ``DELETE /v1/jobs/{id}`` does (``cancel_requested``, then
:func:`gpufleet.lifecycle.cancel.propagate` with :class:`gpufleet.store.queues.SqsNodeSignals`), at a random moment
of its run (0.5-10.5 s after its workload started, so the heartbeat's phase is spread):

- ``heartbeat``: ``signals_queue_url = ""`` — the agent sees the cancel at its next heartbeat (before 2026-12-05);
- ``nudged``: the node's signal queue exists and the agent long-polls it.

Figures per cancel: cancel → the job's process gone, and cancel → the execution FAILED with CANCELLED (the
outcome reported). Usage: .venv/bin/python benchmarks/agent_cancel.py [--jobs 6] [--seed 1]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "functional" / "agent"))

from agent_dispatch import start_moto  # noqa: E402  the same moto server
from agent_procs import wait_gone  # noqa: E402
from conftest import AWS_ENV, Fleet  # noqa: E402  the agent tests' control plane

from gpufleet.lifecycle.cancel import propagate  # noqa: E402
from gpufleet.store.queues import SqsNodeSignals  # noqa: E402

HEARTBEAT_S = 10.0  # the agent's default heartbeat_interval_s


def cancel(fleet: Fleet, job_id: str, epoch: int, node: str) -> None:
    """The API's DELETE: cancel_requested, then propagate over the job item (its placement names the node)."""
    fleet.cancel(job_id)
    item = {**fleet.job(job_id), "status": "RUNNING",
            "placement": {"target": "onprem", "epoch": epoch, "pool": "onprem-test", "node": node,
                          "queue_url": fleet.node_queue(node)}}
    propagate(item, signals=SqsNodeSignals(fleet.sqs))


def mode(fleet: Fleet, name: str, nudged: bool, jobs: int, rng: random.Random) -> dict:
    node = f"node-{name}"
    if nudged:
        fleet.sqs.create_queue(QueueName=fleet.node_queue(node).rsplit("/", 1)[-1] + "_signals")
    agent = fleet.agent(node, heartbeat_interval_s=HEARTBEAT_S, visibility_timeout_s=60, poll_wait_s=20,
                        **({} if nudged else {"signals_queue_url": ""})).start()
    stopped, reported = [], []
    try:
        for i in range(jobs):
            job_id = f"{name}-{i}"
            fleet.submit(job_id, STEPS=100000, STEP_S=0.1)
            epoch = fleet.place(job_id, node, heartbeat_s=60)
            pid = fleet.wait_event(job_id, "workload_started")["pid"]
            time.sleep(0.5 + rng.random() * HEARTBEAT_S)
            t0 = time.monotonic()
            cancel(fleet, job_id, epoch, node)
            stopped.append(wait_gone([pid], timeout=4 * HEARTBEAT_S))
            d = fleet.wait_execution(job_id, epoch, timeout=4 * HEARTBEAT_S)
            if d.get("error") != "CANCELLED":
                raise SystemExit(f"{job_id} ended {d['status']} {d.get('error')}")
            reported.append(time.monotonic() - t0)
    finally:
        agent.stop()
    return {"stopped": stopped, "reported": reported}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6, help="cancels per mode")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.environ.update(AWS_ENV)
    moto, url = start_moto()
    try:
        with tempfile.TemporaryDirectory(prefix="agent-cancel-") as tmp:
            fleet = Fleet(url, Path(tmp))
            try:
                before = mode(fleet, "heartbeat", False, args.jobs, random.Random(args.seed))
                after = mode(fleet, "nudged", True, args.jobs, random.Random(args.seed))
            finally:
                fleet.close()
    finally:
        moto.terminate()
        moto.wait(10)
    print(f"on-prem cancel, heartbeat_interval_s {HEARTBEAT_S:g}; {args.jobs} cancels per mode; AWS = moto on "
          f"127.0.0.1; load average {os.getloadavg()[0]:.1f}")
    out: dict = {}
    for name, r in (("heartbeat", before), ("nudged", after)):
        for what in ("stopped", "reported"):
            xs = r[what]
            print(f"{name:10s} cancel → {what:8s} (s): {[round(x, 2) for x in xs]}  median {statistics.median(xs):.2f}"
                  f"  max {max(xs):.2f}")
            out[f"{name}_{what}_median_s"] = round(statistics.median(xs), 3)
            out[f"{name}_{what}_max_s"] = round(max(xs), 3)
    out["reported_median_nudged_over_heartbeat"] = round(
        statistics.median(after["reported"]) / statistics.median(before["reported"]), 3)
    out.update(samples=args.jobs, heartbeat_interval_s=HEARTBEAT_S, load_average_1m=round(os.getloadavg()[0], 1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
