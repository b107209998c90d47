"""``gpufleet simulate placement|queueing``: run the scheduler's policies on a trace; write CSV + PNG.

    gpufleet simulate placement [--nodes FILE] [--pods FILE] [--seeds N] [--policies a,b] [--tune 1.3] [--out DIR]
    gpufleet simulate queueing [--trace FILE] [--start-day D] [--days N] [--policies a,b] [--out DIR]
    gpufleet simulate replay [--trace CSV] [--jobs N] [--staging-s S] [--load-s S] [--cache cold|warm]
                             [--nodes N] [--gpus-per-node G] [--pass-interval S] --diagnose [--json] [--html FILE]

``replay`` runs a trace of generation jobs phase by phase (:mod:`gpufleet.sim.replay`; a seeded synthetic trace
without ``--trace``) and, with ``--diagnose``, prints the same GPU-time attribution ``gpufleet diagnose`` gives.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpufleet.errors import ValidationFailed


def _policies(value: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in names if p not in known]
    if bad or not names:
        raise ValidationFailed(f"unknown policies {bad}; known: {', '.join(known)}")
    return names


def _placement(args) -> int:
    from gpufleet.scheduler import registry
    from gpufleet.sim.report import run_placement, write_placement

    pols = _policies(args.policies, registry.names("packing"))
    res = run_placement(args.nodes, args.pods, seeds=args.seeds, policies=pols, tune=args.tune)
    csv_path, png = write_placement(res, Path(args.out))
    for p, r in res.items():
        print(f"{p:12s} allocation at 100% arrived: {r.alloc_at_100:6.2f}%  decision p50 {r.p50_decision_us:7.0f} us  p99 {r.p99_decision_us:7.0f} us")
    print(json.dumps({"csv": str(csv_path), "png": str(png), **{p: round(r.alloc_at_100, 3) for p, r in res.items()}}))
    return 0


def _queueing(args) -> int:
    from gpufleet.sim.queueing import POLICIES, QueueingConfig
    from gpufleet.sim.report import run_queueing, write_queueing

    pols = _policies(args.policies, tuple(POLICIES))
    cfg = QueueingConfig(start_day=args.start_day, days=args.days, cloud_gpus=args.cloud_gpus, load=args.load)
    res = run_queueing(cfg, pols, Path(args.trace) if args.trace else None)
    csv_path, png = write_queueing(res, Path(args.out))
    for r in res.values():
        print(json.dumps(r.headline()))
    print(json.dumps({"csv": str(csv_path), "png": str(png)}))
    return 0


def _replay(args) -> int:
    from gpufleet.diagnose.attribution import attribute
    from gpufleet.diagnose.report import html_page, text_table
    from gpufleet.sim.replay import ReplayConfig, load_trace, replay, synthetic_trace

    trace = load_trace(Path(args.trace)) if args.trace else synthetic_trace(
        args.jobs, seed=args.seed, staging_s=args.staging_s, load_s=args.load_s)
    cfg = ReplayConfig(nodes=args.nodes, gpus_per_node=args.gpus_per_node, pass_interval_s=args.pass_interval,
                       cache=args.cache)
    res = replay(trace, cfg)
    summary = {"jobs": len(trace), "makespan_s": round(res.makespan_s, 3),
               "injected_gpu_seconds": {k: round(v, 3) for k, v in res.injected.items()}}
    if not args.diagnose:
        print(json.dumps(summary))
        return 0
    attr = attribute(res.inputs)
    if args.html:
        out = Path(args.html)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(html_page(attr, "gpufleet simulate replay --diagnose"))
    if args.json:
        print(json.dumps({**summary, **attr.as_dict()}))
    else:
        print(text_table(attr.as_dict()))
        if args.html:
            print(f"\nwrote {args.html}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from gpufleet.sim.traces import OPENB_NODES, OPENB_PODS

    sim = sub.add_parser("simulate", help="run scheduling policies on a trace (CSV + PNG)")
    kinds = sim.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser("placement", help="openb placement: allocation % vs arrived % (FGD paper model)")
    p.add_argument("--nodes", default=str(OPENB_NODES))
    p.add_argument("--pods", default=str(OPENB_PODS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--tune", type=float, default=1.3)
    p.add_argument("--policies", default="random,dot-product,packing,best-fit,frag-aware")
    p.add_argument("--out", default="sim-out")
    p.set_defaults(func=_placement)
    q = kinds.add_parser("queueing", help="Philly queueing: teams with quotas, on-prem + priced cloud burst")
    q.add_argument("--trace", default=None)
    q.add_argument("--start-day", type=float, default=40.0)
    q.add_argument("--days", type=float, default=2.0)
    q.add_argument("--load", type=float, default=1.25)
    q.add_argument("--cloud-gpus", type=int, default=32)
    q.add_argument("--policies", default="fifo,drf,ours")
    q.add_argument("--out", default="sim-out")
    q.set_defaults(func=_queueing)
    r = kinds.add_parser("replay", help="replay generation jobs phase by phase on an on-prem pool (--diagnose)")
    r.add_argument("--trace", default=None, help="CSV: submit_s,gpus,model,staging_s,load_s,compute_s,finalize_s")
    r.add_argument("--jobs", type=int, default=24, help="synthetic trace (no --trace): number of jobs")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--staging-s", type=float, default=3.0, help="synthetic trace: input staging per job")
    r.add_argument("--load-s", type=float, default=8.0, help="synthetic trace: model load on a cache miss")
    r.add_argument("--cache", choices=["cold", "warm"], default="cold")
    r.add_argument("--nodes", type=int, default=2)
    r.add_argument("--gpus-per-node", type=int, default=4)
    r.add_argument("--pass-interval", type=float, default=5.0)
    r.add_argument("--diagnose", action="store_true", help="attribute the GPU time (as gpufleet diagnose)")
    r.add_argument("--json", action="store_true")
    r.add_argument("--html", default=None, metavar="FILE", help="with --diagnose: the HTML report")
    r.set_defaults(func=_replay)
