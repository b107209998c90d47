"""Benchmark: GPU allocation on the openb trace, FGD paper model (ATC'23), side by side in one run.

    .venv/bin/python benchmarks/placement_openb.py [--nodes FILE] [--pods FILE] [--seeds N] [--policies a,b,...]
                                                   [--tune 1.3] [--out docs/img]

Defaults: the openb files in ../shared/traces (relative to the repo), 10 seeds (42..51),
tune 1.3, policies random, dot-product, packing, best-fit, fgd, frag-aware (ours). Any
openb-format pod list works. Prints the median allocation % at 100 % arrived per
policy against the published figures of that pod list (the FGD artifact's lists are
known by file name, ``openb_pod_list_<name>.csv``; any other list has none), the
per-decision time p50/p99 on the cluster as a ratio against best-fit, writes CSV + PNG
to --out, and ends with one JSON line. Checks (exit 1 if not met), where the trace has
published figures: best-fit and our fgd within 1 point of theirs, ours >= published FGD.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufleet.sim.report import PLACEMENT_POLICIES, published_for, run_placement, write_placement  # noqa: E402
from gpufleet.sim.traces import OPENB_NODES, OPENB_PODS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(OPENB_NODES))
    ap.add_argument("--pods", default=str(OPENB_PODS))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--policies", default=",".join(PLACEMENT_POLICIES))
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args(argv)
    pols = tuple(p for p in args.policies.split(",") if p)
    t0 = time.perf_counter()

    def progress(pol, seed, run):
        print(
            f"  {pol:12s} seed {seed}: {run.allocation_at(100.0):6.2f}% at 100% arrived ({run.pods} pods, {run.dropped} dropped)",
            flush=True,
        )

    res = run_placement(
        Path(args.nodes), Path(args.pods), seeds=args.seeds, policies=pols, tune=args.tune, progress=progress
    )
    wall = time.perf_counter() - t0
    csv_path, png = write_placement(res, Path(args.out))
    base = res.get("best-fit")
    published = published_for(Path(args.pods))
    print(f"\nGPU allocation at 100% arrived (median of {args.seeds} seeds, tune {args.tune}), {Path(args.pods).name}:")
    print(
        f"{'policy':12s} {'ours-model':>10s} {'published':>10s} {'p50 us':>8s} {'p99 us':>8s} {'p50/bf':>7s} {'p99/bf':>7s}"
    )
    for p, r in res.items():
        pub = published.get("fgd" if p == "frag-aware" else p, float("nan"))
        r50 = r.p50_decision_us / base.p50_decision_us if base else float("nan")
        r99 = r.p99_decision_us / base.p99_decision_us if base else float("nan")
        label = pub if p != "frag-aware" else f"FGD {pub}"
        print(
            f"{p:12s} {r.alloc_at_100:10.2f} {label!s:>10s} {r.p50_decision_us:8.0f} {r.p99_decision_us:8.0f} {r50:7.2f} {r99:7.2f}"
        )
    print(f"wrote {csv_path} and {png}; {wall:.0f} s")
    checks = {}
    if base and published:
        checks["best_fit_within_1pt_of_published"] = abs(base.alloc_at_100 - published["best-fit"]) <= 1.0
    if "fgd" in res and published:
        checks["fgd_within_1pt_of_published"] = abs(res["fgd"].alloc_at_100 - published["fgd"]) <= 1.0
    if "frag-aware" in res and published:
        checks["ours_at_or_above_fgd_published"] = res["frag-aware"].alloc_at_100 >= published["fgd"]
    if "frag-aware" in res and "fgd" in res:
        checks["ours_at_or_above_our_fgd"] = res["frag-aware"].alloc_at_100 >= res["fgd"].alloc_at_100
    out = {
        "pods": Path(args.pods).name,
        "published": published,
        "seeds": args.seeds,
        "tune": args.tune,
        "alloc_at_100": {p: round(r.alloc_at_100, 3) for p, r in res.items()},
        "decision_p50_us": {p: round(r.p50_decision_us, 1) for p, r in res.items()},
        "decision_p99_us": {p: round(r.p99_decision_us, 1) for p, r in res.items()},
        "decision_p50_vs_best_fit": {p: round(r.p50_decision_us / base.p50_decision_us, 3) for p, r in res.items()}
        if base
        else {},
        "decision_p99_vs_best_fit": {p: round(r.p99_decision_us / base.p99_decision_us, 3) for p, r in res.items()}
        if base
        else {},
        "checks": checks,
        "wall_s": round(wall, 1),
    }
    print(json.dumps(out))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
