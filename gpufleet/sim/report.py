"""Run the simulators over seeds/policies and write CSV + PNG outputs (shared by the CLI and benchmarks)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufleet.scheduler.nodetable import Request
from gpufleet.sim.placement import PlacementRun, simulate_placement
from gpufleet.sim.queueing import QueueingConfig, QueueingResult, simulate_queueing
from gpufleet.sim.traces import (
    OPENB_NODES,
    OPENB_PODS,
    OpenbNode,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    openb_table,
)

PLACEMENT_POLICIES = ("random", "dot-product", "packing", "best-fit", "fgd", "frag-aware")
ARRIVED_POINTS = np.arange(0, 131, 1.0)
#: published GPU allocation ratio at 100 % arrived (FGD paper, tune 1.3, median of 10 seeds 42-51) per pod list of
#: the FGD artifact (``openb_pod_list_<key>.csv``), from its experiments/analysis/expected_results/analysis_allo_discrete.csv
_PUBLISHED_COLUMNS = ("random", "dot-product", "clustering", "packing", "best-fit", "fgd")
_PUBLISHED_ROWS = {
    "default": (86.25, 90.56, 91.58, 91.81, 92.91, 95.23),
    "cpu050": (88.98, 93.06, 93.48, 93.53, 93.58, 95.0),
    "cpu100": (87.44, 91.78, 92.54, 92.56, 93.28, 95.21),
    "cpu200": (83.0, 87.76, 89.75, 90.13, 92.15, 94.82),
    "cpu250": (79.94, 83.78, 87.52, 88.08, 91.3, 93.2),
    "gpushare40": (84.96, 89.34, 89.82, 89.81, 91.47, 93.95),
    "gpushare60": (82.78, 86.83, 86.97, 87.25, 89.09, 91.3),
    "gpushare80": (80.65, 84.11, 84.55, 84.72, 86.73, 89.09),
    "gpushare100": (78.93, 82.07, 82.3, 82.22, 84.6, 86.64),
    "gpuspec10": (86.31, 90.25, 91.94, 92.23, 93.12, 94.7),
    "gpuspec20": (86.09, 88.32, 89.13, 89.35, 88.47, 94.69),
    "gpuspec25": (85.41, 85.45, 86.41, 86.78, 85.7, 93.92),
    "gpuspec33": (83.81, 79.83, 81.04, 82.33, 80.41, 87.88),
    "multigpu20": (86.84, 91.81, 93.38, 93.51, 93.73, 95.53),
    "multigpu30": (86.57, 93.02, 94.55, 94.77, 94.53, 96.39),
    "multigpu40": (85.23, 94.09, 95.47, 95.56, 95.09, 96.9),
    "multigpu50": (81.39, 94.75, 95.64, 96.07, 95.58, 97.09),
}
PUBLISHED_BY_TRACE = {k: dict(zip(_PUBLISHED_COLUMNS, v, strict=True)) for k, v in _PUBLISHED_ROWS.items()}
#: the default trace's published figures
PUBLISHED = PUBLISHED_BY_TRACE["default"]


def published_for(pods_path: Path) -> dict[str, float]:
    """The published figures for an FGD-artifact pod list (by its file name), or {} for any other trace."""
    stem = Path(pods_path).stem
    prefix = "openb_pod_list_"
    return PUBLISHED_BY_TRACE.get(stem[len(prefix) :], {}) if stem.startswith(prefix) else {}


@dataclass
class PlacementSummary:
    policy: str
    alloc_at_100: float  # median over seeds
    alloc_at_100_per_seed: list[float]
    curve: np.ndarray  # median allocation % at ARRIVED_POINTS
    p50_decision_us: float
    p99_decision_us: float
    dropped: float


def run_placement(
    nodes_path: Path = OPENB_NODES,
    pods_path: Path = OPENB_PODS,
    seeds: int = 10,
    policies=PLACEMENT_POLICIES,
    tune: float = 1.3,
    first_seed: int = 42,
    progress=None,
) -> dict[str, PlacementSummary]:
    nodes = load_openb_nodes(Path(nodes_path))
    pods = load_openb_pods(Path(pods_path))
    return place_pods(nodes, pods, range(first_seed, first_seed + seeds), policies, tune, progress)


def place_pods(
    nodes: list[OpenbNode], pods: list[Request], seeds, policies=PLACEMENT_POLICIES, tune: float = 1.3, progress=None
) -> dict[str, PlacementSummary]:
    """Every policy on the seeded workloads of ``pods`` (one run per seed in ``seeds``), summarised per policy."""
    out = {}
    for pol in policies:
        runs: list[PlacementRun] = []
        for s in seeds:
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


def run_queueing(
    cfg: QueueingConfig, policies=QUEUEING_POLICIES, trace_path: Path | None = None
) -> dict[str, QueueingResult]:
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
