"""Benchmark: on-prem dispatch latency and GPU idle gap, fresh process per job vs a warm worker, in one run.

Everything is real except AWS, which is a moto server on 127.0.0.1 (a separate process): the agent tests'
control plane (``tests/functional/agent/conftest.py``: node API behind a SigV4 gateway, a Run state
machine, the dispatch step), one agent process (`python -m onprem_agent`, one slot, prefetch 1) and the
real runtime running the ``generate`` stage of ``wan-tiny`` on the CPU (32 px, 5 frames). The same jobs
run twice, on two agents one after the other:

- ``fresh``: ``warm_workers = false`` — every job is a fresh ``python -m gpufleet.runtime`` that imports
  the stack and loads the model (already in the node cache: no download);
- ``resident``: ``warm_workers = true`` — every job goes to the slot's warm worker, which has the stack
  imported and, after the first job, the model resident.

Figures (from the attempts' phase marks, :mod:`gpufleet.phases`):
- dispatch → first denoising step: ``first_step − dispatched``, one job at a time on an idle agent
  (after a warm-up job), and ``started − dispatched`` (the stage began);
- idle gap: jobs queued at once, back to back; gap = next job's ``first_step`` − previous job's
  ``generation_done`` (so it includes one denoising step, reported as ``mean_step_s``).

Usage: .venv/bin/python benchmarks/agent_dispatch.py [--jobs 4] [--steps 4]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "functional" / "agent"))

from conftest import AWS_ENV, Fleet  # noqa: E402  the agent tests' control plane

from gpufleet.phases import attempt_marks  # noqa: E402
from gpufleet.store.dynamo import unmarshal  # noqa: E402
from gpufleet.tables import attempt_sk, job_pk  # noqa: E402

RUNTIME_ENV = {"GPUFLEET_TINY_GENERATE_SIDE": "32", "GPUFLEET_TORCH_THREADS": "1",
               "GPUFLEET_PROGRESS_INTERVAL_S": "1", "GPUFLEET_LOG_FLUSH_S": "1",
               "GPUFLEET_CHECKPOINT_EVERY_STEPS": "0"}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env=dict(os.environ, MOTO_PORT=str(port)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(url + "/moto-api/", timeout=1)
            break
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("moto server did not start") from None
            time.sleep(0.1)
    requests.post(f"{url}/moto-api/config", json={"stepfunctions": {"execute_state_machine": True}}, timeout=5)
    return proc, url


def spec(steps: int) -> dict:
    return {"workload": {"kind": "video.generate", "prompt": "a red fox", "model": "wan-tiny", "width": 64,
                         "height": 64, "frames": 5, "steps": steps, "seed": 7}, "resources": {"gpus": 1}}


def marks(fleet: Fleet, job_id: str) -> dict:
    got = fleet.ddb.get_item(TableName=fleet.tables.jobs, ConsistentRead=True,
                             Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": attempt_sk(1)}})
    return attempt_marks(unmarshal(got["Item"]))


def run_jobs(fleet: Fleet, node: str, ids: list[str], steps: int) -> dict[str, dict]:
    for j in ids:
        fleet.submit(j, spec=spec(steps))
    for j in ids:
        fleet.place(j, node, heartbeat_s=60, stage="generate")
    out = {}
    for j in ids:
        d = fleet.wait_execution(j, 1, timeout=600)
        if d["status"] != "SUCCEEDED":
            raise SystemExit(f"{j} ended {d['status']}: {d.get('error')} {d.get('cause')}")
        out[j] = marks(fleet, j)
    return out


def mode(fleet: Fleet, name: str, warm: bool, jobs: int, steps: int) -> dict:
    node = f"node-{name}"
    agent = fleet.agent(node, warm_workers=warm, runtime_command=[sys.executable, "-m", "gpufleet.runtime"],
                        child_env=RUNTIME_ENV, poll_wait_s=20, heartbeat_interval_s=2.0, visibility_timeout_s=60,
                        node_heartbeat_s=5.0, node_ttl_s=30).start()
    try:
        run_jobs(fleet, node, [f"{name}-warmup"], steps)
        single = {}
        for i in range(jobs):
            single.update(run_jobs(fleet, node, [f"{name}-one-{i}"], steps))
            time.sleep(0.5)  # the agent idle, long-polling
        queued = run_jobs(fleet, node, [f"{name}-b2b-{i}" for i in range(jobs + 1)], steps)
    finally:
        agent.stop()
    order = sorted(queued.values(), key=lambda m: m["started"])
    gaps = [b["first_step"] - a["generation_done"] for a, b in zip(order, order[1:], strict=False)]
    return {
        "to_first_step": [m["first_step"] - m["dispatched"] for m in single.values()],
        "to_started": [m["started"] - m["dispatched"] for m in single.values()],
        "gaps": gaps,
        "model_load": sorted({m.get("model_cache", "?") for m in list(single.values()) + order}),
        "mean_step_s": statistics.mean(m["mean_step_s"] for m in order if "mean_step_s" in m),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=4, help="back-to-back jobs per mode (and dispatch samples)")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    os.environ.update(AWS_ENV)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    moto, url = start_moto()
    try:
        with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp:
            fleet = Fleet(url, Path(tmp))
            try:
                fresh = mode(fleet, "fresh", False, args.jobs, args.steps)
                resident = mode(fleet, "resident", True, args.jobs, args.steps)
            finally:
                fleet.close()
    finally:
        moto.terminate()
        moto.wait(10)

    def ms(xs):
        return [round(x * 1000) for x in xs]

    print(f"wan-tiny generate on the CPU, {args.steps} steps; {args.jobs} samples per figure; AWS = moto on 127.0.0.1;"
          f" load average {os.getloadavg()[0]:.1f}")
    for name, r in (("fresh process", fresh), ("warm worker", resident)):
        print(f"{name:14s} dispatch → stage started (ms): {ms(r['to_started'])}  median "
              f"{statistics.median(r['to_started']) * 1000:.0f}")
        print(f"{name:14s} dispatch → first step    (ms): {ms(r['to_first_step'])}  median "
              f"{statistics.median(r['to_first_step']) * 1000:.0f}")
        print(f"{name:14s} idle gap back to back    (ms): {ms(r['gaps'])}  mean {statistics.mean(r['gaps']) * 1000:.0f}"
              f"  (model: {r['model_load']}, mean step {r['mean_step_s'] * 1000:.0f} ms)")
    ratio = statistics.mean(resident["gaps"]) / statistics.mean(fresh["gaps"])
    print(f"idle gap warm worker / fresh process: {ratio:.3f}")
    print(json.dumps({
        "fresh_dispatch_to_first_step_median_s": round(statistics.median(fresh["to_first_step"]), 3),
        "resident_dispatch_to_first_step_median_s": round(statistics.median(resident["to_first_step"]), 3),
        "resident_dispatch_to_started_median_s": round(statistics.median(resident["to_started"]), 3),
        "idle_gap_fresh_mean_s": round(statistics.mean(fresh["gaps"]), 3),
        "idle_gap_resident_mean_s": round(statistics.mean(resident["gaps"]), 3),
        "idle_gap_resident_over_fresh": round(ratio, 3),
        "resident_model_cache": resident["model_load"],
        "mean_step_s": round(resident["mean_step_s"], 4),
        "samples": args.jobs,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
