"""Derived variants of an openb pod list: the same trace with a different workload shape, seeded.

Each variant starts from the pod list and changes one thing (``Variant.kind``), to a target
``level``; everything else is the original trace:

- ``multigpu``: multi-GPU pods, sampled with replacement from the trace's own multi-GPU pods,
  are added until they carry ``level`` of the requested GPU milli;
- ``gpushare``: likewise for GPU-sharing pods (< 1 GPU);
- ``cpu``: likewise for CPU-only pods, until they are ``level`` of the pods;
- ``gpuspec``: a ``level`` fraction of the GPU pods (drawn at random, constrained ones left
  as they are) is constrained to ONE GPU model, drawn with probability proportional to the
  cluster's GPUs of that model among the models with a node that can host the pod;
- ``cpuheavy``: a ``level`` fraction of the GPU pods asks twice its CPU (capped at the
  largest CPU any node that could host it has).

The FGD artifact's own variants (``openb_pod_list_multigpu50`` etc.) are built in the same
spirit (added or re-labelled pods); these are this project's, generated from the default
trace with a seed so anyone can rebuild them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpufleet.scheduler.nodetable import Request
from gpufleet.sim.traces import OpenbNode

KINDS = ("multigpu", "gpushare", "cpu", "gpuspec", "cpuheavy")


@dataclass(frozen=True)
class Variant:
    kind: str
    level: float  # a fraction in (0, 1)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown variant kind {self.kind!r}; known: {', '.join(KINDS)}")
        if not 0.0 < self.level < 1.0:
            raise ValueError("a variant's level is a fraction in (0, 1)")

    @property
    def name(self) -> str:
        return f"{self.kind}{round(self.level * 100):02d}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``multigpu40`` -> Variant("multigpu", 0.40)."""
        kind = text.rstrip("0123456789")
        digits = text[len(kind) :]
        if not digits:
            raise ValueError(f"variant {text!r} needs a percentage, e.g. {text}40")
        return cls(kind, int(digits) / 100.0)


#: the variants the placement benchmark judges policies on (with the default trace)
DEFAULT_VARIANTS = tuple(Variant.parse(v) for v in ("multigpu40", "gpushare60", "gpuspec33", "cpu25", "cpuheavy50"))


def _is_multi(r: Request) -> bool:
    return r.num_gpu > 1


def _is_share(r: Request) -> bool:
    return r.is_share


def _is_cpu(r: Request) -> bool:
    return r.num_gpu == 0


def _grow(pods: list[Request], member, level: float, by_gpu: bool, rng: np.random.Generator) -> list[Request]:
    pool = [p for p in pods if member(p)]
    if not pool:
        raise ValueError("the trace has no pod of this kind to sample from")

    def weight(p: Request) -> float:
        return float(p.total_gpu_milli) if by_gpu else 1.0

    part = sum(weight(p) for p in pool)
    total = sum(weight(p) for p in pods)
    out = list(pods)
    while part < level * total:
        p = pool[int(rng.integers(len(pool)))]
        out.append(p)
        part += weight(p)
        total += weight(p)
    return out


def _hosts(nodes: list[OpenbNode], req: Request) -> list[OpenbNode]:
    return [n for n in nodes if n.gpu >= req.num_gpu and n.cpu_milli >= req.cpu_milli and n.memory_mib >= req.mem_mib]


def _constrain(pods: list[Request], nodes: list[OpenbNode], level: float, rng: np.random.Generator) -> list[Request]:
    out = list(pods)
    gpu_idx = [i for i, p in enumerate(pods) if p.num_gpu > 0]
    chosen = rng.permutation(gpu_idx)[: round(level * len(gpu_idx))]
    for i in sorted(int(x) for x in chosen):
        p = out[i]
        if p.gpu_types:
            continue
        gpus: dict[str, int] = {}
        for n in _hosts(nodes, p):
            gpus[n.model] = gpus.get(n.model, 0) + n.gpu
        if not gpus:
            continue
        models = sorted(gpus)
        w = np.array([gpus[m] for m in models], dtype=float)
        out[i] = replace(p, gpu_types=frozenset({models[int(rng.choice(len(models), p=w / w.sum()))]}))
    return out


def _cpu_heavy(pods: list[Request], nodes: list[OpenbNode], level: float, rng: np.random.Generator) -> list[Request]:
    out = list(pods)
    gpu_idx = [i for i, p in enumerate(pods) if p.num_gpu > 0]
    chosen = rng.permutation(gpu_idx)[: round(level * len(gpu_idx))]
    for i in sorted(int(x) for x in chosen):
        p = out[i]
        cap = max(
            (n.cpu_milli for n in _hosts(nodes, p) if not p.gpu_types or n.model in p.gpu_types), default=p.cpu_milli
        )
        out[i] = replace(p, cpu_milli=max(p.cpu_milli, min(2 * p.cpu_milli, cap)))
    return out


def derive(pods: list[Request], nodes: list[OpenbNode], variant: Variant, seed: int) -> list[Request]:
    """The pod list reshaped as ``variant`` says (see module docstring); the same seed gives the same list."""
    rng = np.random.default_rng(seed)
    if variant.kind == "multigpu":
        return _grow(pods, _is_multi, variant.level, True, rng)
    if variant.kind == "gpushare":
        return _grow(pods, _is_share, variant.level, True, rng)
    if variant.kind == "cpu":
        return _grow(pods, _is_cpu, variant.level, False, rng)
    if variant.kind == "gpuspec":
        return _constrain(pods, nodes, variant.level, rng)
    return _cpu_heavy(pods, nodes, variant.level, rng)


def describe(pods: list[Request]) -> dict[str, float]:
    """Shares that characterise a pod list (what the variants change)."""
    gpu = sum(p.total_gpu_milli for p in pods) or 1
    gpu_pods = [p for p in pods if p.num_gpu > 0] or [None]
    return {
        "pods": len(pods),
        "multigpu_gpu_share": round(sum(p.total_gpu_milli for p in pods if p.num_gpu > 1) / gpu, 3),
        "gpushare_gpu_share": round(sum(p.total_gpu_milli for p in pods if p.is_share) / gpu, 3),
        "cpu_only_pod_share": round(sum(1 for p in pods if p.num_gpu == 0) / len(pods), 3),
        "constrained_gpu_pod_share": round(
            sum(1 for p in gpu_pods if p is not None and p.gpu_types) / len(gpu_pods), 3
        ),
        "gpu_pod_cores_per_gpu": round(sum(p.cpu_milli for p in pods if p.num_gpu > 0) / gpu, 3),
    }


def write_openb_pods(pods: list[Request], path) -> None:
    """Write ``pods`` as an openb pod list (the columns :func:`~gpufleet.sim.traces.load_openb_pods` reads)."""
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for i, p in enumerate(pods):
            w.writerow([f"pod-{i:05d}", p.cpu_milli, p.mem_mib, p.num_gpu, p.gpu_milli, "|".join(sorted(p.gpu_types))])
