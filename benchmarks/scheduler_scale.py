"""Benchmark: the pure scheduling cycle over pending × nodes × running allocations.

    .venv/bin/python benchmarks/scheduler_scale.py [--repeat 3] [--before PATH] [--quick]

Builds synthetic snapshots (one on-prem pool of 8 × A100 nodes, 20 teams with quota
nodes, pending jobs of 1 GPU at priority 100) and times ``run_cycle`` alone (no I/O):

- **empty** cluster: every GPU free, pending jobs placed by the packing policy; scanned
  over pending (nodes fixed) and over nodes (pending fixed);
- **saturated** cluster: every GPU held by running allocations (whole GPUs, or shares
  of 500 / 250 milli to vary the running count at a fixed node count), so every pending
  job goes through preemption; scanned over pending, nodes and running allocations.
  Running jobs are mostly priority 100 (no victim for a priority-100 job), 1 % are
  priority 0 of the pending jobs' teams (eligible victims exist but are few);
- the **target** point: 5,000 pending × 1,000 nodes × 8,000 running (saturated).

Each point is the median of ``--repeat`` runs, wall and process CPU time (on a shared,
loaded machine the CPU time is the steadier figure). ``growth`` per axis is the time
ratio of the largest to the smallest point divided by the size ratio (1.0 = linear,
< 1 = sublinear), in CPU and in wall time. ``--before PATH`` runs the same target point and saturated-pending scan
with ``PYTHONPATH=PATH`` (another checkout, e.g. a worktree of the previous commit)
in a subprocess, once per point (the old code is slow), so both appear in one run.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and "--worker" not in sys.argv:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEAMS = 20
GPUS = 8


def build(pending: int, nodes: int, saturated: bool, share: int = 1000, seed: int = 0):
    """A snapshot of ``nodes`` 8-GPU nodes; saturated: every GPU held in ``share``-milli allocations."""
    import random

    from gpufleet.pools import parse_pools
    from gpufleet.scheduler.model import (
        ALL_TYPES,
        Allocation,
        Member,
        NodeState,
        PendingJob,
        QuotaNode,
        Snapshot,
        ancestors,
    )

    rnd = random.Random(seed)
    pools = parse_pools([{"name": "onprem-a", "kind": "onprem", "region": "eu", "gpu_type": "A100",
                          "max_gpus": nodes * GPUS, "price_per_gpu_hour": 0.5}])
    now = 10_000.0
    node_states, running = [], []
    usage: dict[str, dict[str, int]] = {}
    for i in range(nodes):
        free = (0,) * GPUS if saturated else (1000,) * GPUS
        node_states.append(NodeState(f"n{i:05d}", "onprem-a", "A100", free, 128_000, 1_024_000))
        if not saturated:
            continue
        for g in range(GPUS):
            for k in range(1000 // share):
                team = rnd.randrange(TEAMS)
                low = rnd.random() < 0.01
                owner = f"t/team{team}/u{rnd.randrange(4)}"
                a = Allocation(f"r{i}-{g}-{k}", 1, owner, 0 if low else 100, "onprem-a", "A100", (Member(f"n{i:05d}", (g,)),),
                               share, 1, cpu_milli=0, memory_mib=0, started_at=now - rnd.uniform(60, 3600),
                               checkpoint_at=None if rnd.random() < 0.5 else now - rnd.uniform(0, 60))
                running.append(a)
                for p in ancestors(owner):
                    per = usage.setdefault(p, {})
                    per["A100"] = per.get("A100", 0) + share
                    per[ALL_TYPES] = per.get(ALL_TYPES, 0) + share
    total = nodes * GPUS * 1000
    quotas = {f"t/team{t}": QuotaNode(f"t/team{t}", {"*": total // (TEAMS * 2)}, {"*": total}, {}) for t in range(TEAMS)}
    jobs = tuple(
        PendingJob(f"p{j:06d}", "t", f"team{rnd.randrange(TEAMS)}", "u0", priority=100, created_at=float(j), pending_since=now - 60,
                   num_gpu=1, gpu_milli=1000, gpu_type="A100", cpu_milli=1000, memory_mib=8192)
        for j in range(pending)
    )
    return Snapshot(now=now, jobs=jobs, nodes=tuple(node_states), pools=pools, quotas=quotas, usage=usage, running=tuple(running))


def measure(pending: int, nodes: int, saturated: bool, share: int, repeat: int) -> dict:
    """Median cycle time (s) of ``repeat`` runs at one point, with what the pass decided."""
    from gpufleet.scheduler.cycle import run_cycle
    from gpufleet.scheduler.framework import SchedulerConfig

    snap = build(pending, nodes, saturated, share)
    cfg = SchedulerConfig(max_jobs_per_pass=max(pending, 1))
    times, cpu, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_cycle(snap, cfg, seed=0)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"pending": pending, "nodes": nodes, "running": len(snap.running), "saturated": saturated,
            "cycle_s": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times],
            "cpu_s": round(statistics.median(cpu), 3),
            "placed": len(result.placements), "preempted": len(result.preemptions)}


def growth(points: list[dict], axis: str, key: str = "cpu_s") -> float:
    """(t_max / t_min) / (size_max / size_min) of ``key`` (CPU or wall seconds): 1.0 = linear in ``axis``."""
    lo, hi = min(points, key=lambda p: p[axis]), max(points, key=lambda p: p[axis])
    return round((hi[key] / max(lo[key], 1e-9)) / (hi[axis] / lo[axis]), 3)


def before(path: str, pending: int, nodes: int, share: int) -> dict:
    """One saturated point measured on the checkout at ``path`` (subprocess, PYTHONPATH=path)."""
    env = {**os.environ, "PYTHONPATH": path}
    args = [sys.executable, str(Path(__file__).resolve()), "--worker", f"{pending},{nodes},{share}"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, cwd=path)
    return json.loads(out.stdout.strip().splitlines()[-1])


def load() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", help="a checkout of the code to compare with (its root directory)")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        pending, nodes, share = (int(x) for x in args.worker.split(","))
        print(json.dumps(measure(pending, nodes, True, share, 1)))
        return
    k = 10 if args.quick else 1
    load_before = load()
    t_start = time.perf_counter()
    report: dict = {"repeat": args.repeat}
    empty_pending = [measure(p // k, 1000 // k, False, 1000, args.repeat) for p in (1000, 2000, 4000)]
    empty_nodes = [measure(1000 // k, n // k, False, 1000, args.repeat) for n in (500, 1000, 2000)]
    sat_pending = [measure(p // k, 1000 // k, True, 1000, args.repeat) for p in (1000, 2000, 4000)]
    sat_nodes = [measure(1000 // k, n // k, True, 1000, args.repeat) for n in (500, 1000, 2000)]
    sat_running = [measure(1000 // k, 1000 // k, True, s, args.repeat) for s in (1000, 500, 250)]
    target = measure(5000 // k, 1000 // k, True, 1000, args.repeat)
    for name, pts, axis in (("empty_pending", empty_pending, "pending"), ("empty_nodes", empty_nodes, "nodes"),
                            ("saturated_pending", sat_pending, "pending"), ("saturated_nodes", sat_nodes, "nodes"),
                            ("saturated_running", sat_running, "running")):
        print(f"{name}: growth {growth(pts, axis)} in CPU time, {growth(pts, axis, 'cycle_s')} in wall time (1.0 = linear)")
        for p in pts:
            print(f"  pending {p['pending']:>6} nodes {p['nodes']:>5} running {p['running']:>6}: {p['cycle_s']:8.3f} s "
                  f"(CPU {p['cpu_s']:.3f} s) "
                  f"(runs {p['runs']}, placed {p['placed']}, preempted {p['preempted']})")
        report[f"{name}_growth_cpu"] = growth(pts, axis)
        report[f"{name}_growth_wall"] = growth(pts, axis, "cycle_s")
        report[f"{name}_cpu_s"] = [p["cpu_s"] for p in pts]
        report[f"{name}_s"] = [p["cycle_s"] for p in pts]
    print(f"target {target['pending']} pending x {target['running']} running: {target['cycle_s']} s "
          f"(runs {target['runs']}, CPU {target['cpu_s']} s)")
    report["target_s"], report["target_cpu_s"] = target["cycle_s"], target["cpu_s"]
    report["target"] = [target["pending"], target["nodes"], target["running"]]
    if args.before:
        old_sat = [before(args.before, p // k, 1000 // k, 1000) for p in (500, 1000)]
        old_target = before(args.before, 5000 // k, 1000 // k, 1000)
        for p in [*old_sat, old_target]:
            print(f"before: pending {p['pending']:>6} running {p['running']:>6}: {p['cycle_s']:8.3f} s (CPU {p['cpu_s']:.3f} s) "
                  f"(placed {p['placed']}, preempted {p['preempted']})")
        report["before_saturated_pending_s"] = [p["cycle_s"] for p in old_sat]
        report["before_saturated_pending_cpu_s"] = [p["cpu_s"] for p in old_sat]
        report["before_target_s"], report["before_target_cpu_s"] = old_target["cycle_s"], old_target["cpu_s"]
        report["speedup_target"] = round(old_target["cycle_s"] / max(target["cycle_s"], 1e-9), 1)
        report["speedup_target_cpu"] = round(old_target["cpu_s"] / max(target["cpu_s"], 1e-9), 1)
        same = (old_target["placed"], old_target["preempted"]) == (target["placed"], target["preempted"])
        report["same_decision_counts_at_target"] = same
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    report["load_avg_1m_before"], report["load_avg_1m_after"], report["cpus"] = load_before, load(), os.cpu_count()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
