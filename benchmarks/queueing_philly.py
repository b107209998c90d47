"""Benchmark: FIFO vs DRF vs ours on a Philly sample (teams with quotas, on-prem + priced cloud burst).

    .venv/bin/python benchmarks/queueing_philly.py [--start-day 40] [--days 2] [--load 1.25] [--cloud-gpus 32]
                                                   [--policies fifo,drf,ours] [--out docs/img]
                                                   [--trace FILE] [--windows 24,58,78]

Sampling (to run in a few minutes): the jobs submitted in ``[start-day, start-day + days)``
days after the trace's first submission (default: days 40-42), durations capped at 24 h,
jobs wider than 8 GPUs become gangs of 8-GPU nodes; the on-prem pool is sized so that
mean demand is ``load`` x its capacity. Prints average JCT, p50/p99 queue wait, on-prem
utilisation, cloud cost, preemptions and Jain's fairness index (usage / entitlement over
teams with demand, time-averaged) per policy with ratios against FIFO, writes CSV + PNG,
and ends with one JSON line.

``--windows 20,60,80`` instead runs each of those start days (``--days`` long each) and
reports, per window and averaged over them, each policy's JCT ratio against FIFO and its
fairness (plain and demand-capped); ``--borrow-caps 1,2,none`` repeats the non-FIFO policies with
each cap on borrowing (a trade-off curve): the held-out check (the policy's settings were chosen on the day-40 window; see
docs/benchmarks.md). CSV/PNG are not written in this mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufleet.sim.queueing import QueueingConfig  # noqa: E402
from gpufleet.sim.report import QUEUEING_POLICIES, run_queueing, write_queueing  # noqa: E402
from gpufleet.sim.traces import PHILLY  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start-day", type=float, default=40.0)
    ap.add_argument("--days", type=float, default=2.0)
    ap.add_argument("--load", type=float, default=1.25)
    ap.add_argument("--cloud-gpus", type=int, default=32)
    ap.add_argument("--policies", default=",".join(QUEUEING_POLICIES))
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--trace", default=str(PHILLY))
    ap.add_argument("--windows", default=None, help="comma-separated start days: held-out mode")
    ap.add_argument(
        "--borrow-caps", default="none", help="held-out mode: borrowing caps (x guarantee, or none) to sweep"
    )
    args = ap.parse_args(argv)
    if args.windows:
        return held_out(args)
    cfg = QueueingConfig(start_day=args.start_day, days=args.days, load=args.load, cloud_gpus=args.cloud_gpus)
    t0 = time.perf_counter()
    res = run_queueing(cfg, tuple(p for p in args.policies.split(",") if p), Path(args.trace))
    wall = time.perf_counter() - t0
    csv_path, png = write_queueing(res, Path(args.out))
    base = res.get("fifo")
    cols = [
        "avg_jct_h",
        "p50_wait_h",
        "p99_wait_h",
        "utilization",
        "cloud_cost",
        "fairness",
        "preemptions",
        "lost_gpu_h",
    ]
    print(f"{'policy':6s} " + " ".join(f"{c:>12s}" for c in cols))
    for p, r in res.items():
        h = r.headline()
        print(f"{p:6s} " + " ".join(f"{h[c]:12.3f}" for c in cols))
    if base:
        print(
            "ratios vs fifo: "
            + "; ".join(
                f"{p}: JCT {r.avg_jct_h / base.avg_jct_h:.2f}x, p99 wait {r.p99_wait_h / max(base.p99_wait_h, 1e-9):.2f}x, "
                f"cost {r.cloud_cost / max(base.cloud_cost, 1e-9):.2f}x, fairness {r.fairness / base.fairness:.2f}x"
                for p, r in res.items()
            )
        )
    print(f"{next(iter(res.values())).jobs} jobs; wrote {csv_path} and {png}; {wall:.0f} s")
    print(
        json.dumps(
            {"config": cfg.__dict__, "results": {p: r.headline() for p, r in res.items()}, "wall_s": round(wall, 1)}
        )
    )
    return 0


def held_out(args) -> int:
    """Each window's results and the mean JCT ratio / fairness over windows (see module docstring)."""
    pols = tuple(p for p in args.policies.split(",") if p)
    if "fifo" not in pols:
        raise SystemExit("--windows needs fifo among --policies (ratios are against it)")
    caps = [None if c == "none" else float(c) for c in args.borrow_caps.split(",") if c]
    t0 = time.perf_counter()
    windows = [float(w) for w in args.windows.split(",") if w]
    per: dict[str, dict] = {}
    for start in windows:
        cfg = QueueingConfig(start_day=start, days=args.days, load=args.load, cloud_gpus=args.cloud_gpus)
        res = run_queueing(cfg, ("fifo",), Path(args.trace))  # FIFO has no quotas: one run whatever the cap
        for cap in caps:
            capped = replace(cfg, borrow_cap=cap)
            for p, r in run_queueing(capped, tuple(p for p in pols if p != "fifo"), Path(args.trace)).items():
                res[p if cap is None else f"{p}@cap{cap:g}"] = r
        base = res["fifo"]
        per[f"{start:g}"] = {
            p: {**r.headline(), "jct_vs_fifo": round(r.avg_jct_h / base.avg_jct_h, 4)} for p, r in res.items()
        }
        print(
            f"window day {start:g}+{args.days:g} ({base.jobs} jobs): "
            + "; ".join(
                f"{p} JCT {v['avg_jct_h']:.2f} h ({v['jct_vs_fifo']:.2f}x fifo), Jain {v['fairness']:.3f}"
                f" (demand-capped {v['fairness_demand_capped']:.3f})"
                for p, v in per[f"{start:g}"].items()
            ),
            flush=True,
        )
    keys = list(next(iter(per.values())))
    mean = {
        p: {
            m: round(sum(w[p][m] for w in per.values()) / len(per), 4)
            for m in ("jct_vs_fifo", "fairness", "fairness_demand_capped")
        }
        for p in keys
    }
    wall = time.perf_counter() - t0
    print(f"mean over windows: {mean}; {wall:.0f} s")
    print(
        json.dumps(
            {
                "days": args.days,
                "load": args.load,
                "cloud_gpus": args.cloud_gpus,
                "borrow_caps": args.borrow_caps,
                "windows": per,
                "mean": mean,
                "wall_s": round(wall, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
