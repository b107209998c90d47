"""Run the simulators over seeds/policies and write CSV + PNG outputs (shared by the CLI and benchmarks)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufleet.sim.placement import PlacementRun, simulate_placement
from gpufleet.sim.queueing import QueueingConfig, QueueingResult, simulate_queueing
from gpufleet.sim.traces import OPENB_NODES, OPENB_PODS, load_openb_nodes, load_openb_pods, load_philly, openb_table

PLACEMENT_POLICIES = ("random", "dot-product", "packing", "best-fit", "frag-aware")
ARRIVED_POINTS = np.arange(0, 131, 1.0)
#: published GPU allocation ratio at 100 % arrived (FGD paper, tune 1.3, median of 10 seeds)
PUBLISHED = {"random": 86.25, "dot-product": 90.56, "clustering": 91.58, "packing": 91.81, "best-fit": 92.91, "fgd": 95.23}


@dataclass
class PlacementSummary:
    policy: str
    alloc_at_100: float  # median over seeds
    alloc_at_100_per_seed: list[float]
    curve: np.ndarray  # median allocation % at ARRIVED_POINTS
    p50_decision_us: float
    p99_decision_us: float
    dropped: float


def run_placement(nodes_path: Path = OPENB_NODES, pods_path: Path = OPENB_PODS, seeds: int = 10, policies=PLACEMENT_POLICIES,
                  tune: float = 1.3, first_seed: int = 42, progress=None) -> dict[str, PlacementSummary]:
    nodes = load_openb_nodes(Path(nodes_path))
    pods = load_openb_pods(Path(pods_path))
    out = {}
    for pol in policies:
        runs: list[PlacementRun] = []
        for s in range(first_seed, first_seed + seeds):
            runs.append(simulate_placement(lambda: openb_table(nodes), pods, pol, s, tune=tune))
            if progress:
                progress(pol, s, runs[-1])
        times = np.concatenate([r.decision_s for r in runs]) * 1e6
        out[pol] = PlacementSummary(
            pol,
            float(np.median([r.allocation_at(100.0) for r in runs])),
            [r.allocation_at(100.0) for r in runs],
            np.median(np.stack([r.curve(ARRIVED_POINTS) for r in runs]), axis=0),
            float(np.percentile(times, 50)),
            float(np.percentile(times, 99)),
            float(np.median([r.dropped for r in runs])),
        )
    return out


def write_placement(results: dict[str, PlacementSummary], outdir: Path) -> tuple[Path, Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    csv_path = outdir / "placement_openb.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrived_pct", *results])
        for i, a in enumerate(ARRIVED_POINTS):
            w.writerow([f"{a:.0f}", *(f"{results[p].curve[i]:.3f}" for p in results)])
    png = outdir / "placement_openb.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ARRIVED_POINTS, np.minimum(ARRIVED_POINTS, 100), "k:", lw=1, label="ideal")
    for p, r in results.items():
        ax.plot(ARRIVED_POINTS, r.curve, label=f"{p} ({r.alloc_at_100:.2f}% @100%)")
    ax.axvline(100, color="grey", lw=0.5)
    ax.set_xlabel("arrived workload (% of cluster GPUs)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_title("openb: GPU allocation vs arrived workload (median over seeds)")
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return csv_path, png


QUEUEING_POLICIES = ("fifo", "drf", "ours")


def run_queueing(cfg: QueueingConfig, policies=QUEUEING_POLICIES, trace_path: Path | None = None) -> dict[str, QueueingResult]:
    trace = load_philly(trace_path) if trace_path else load_philly()
    return {p: simulate_queueing(trace, p, cfg) for p in policies}


def write_queueing(results: dict[str, QueueingResult], outdir: Path) -> tuple[Path, Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    csv_path = outdir / "queueing_philly.csv"
    keys = list(next(iter(results.values())).headline())
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in results.values():
            w.writerow(r.headline())
    png = outdir / "queueing_philly.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for p, r in results.items():
        tl = np.array(r.timeline) if r.timeline else np.zeros((0, 3))
        if len(tl):
            a1.step(tl[:, 0] / 3600, tl[:, 1], where="post", label=p, lw=0.8)
            a2.step(tl[:, 0] / 3600, tl[:, 2], where="post", label=f"{p} (mean {r.fairness:.3f})", lw=0.8)
    a1.set_ylabel("on-prem GPUs busy")
    a2.set_ylabel("Jain index (usage/entitlement)")
    a2.set_xlabel("hours")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    a1.set_title("Philly sample: utilisation and fairness through time")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return csv_path, png
