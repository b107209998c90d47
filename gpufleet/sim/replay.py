"""Replay a trace of generation jobs, phase by phase, on an on-prem pool and attribute its GPU time offline.

Model:
- A trace row (:class:`TraceJob`) is a job submitted at ``submit_s`` wanting ``gpus`` GPUs on one node, with the
  seconds of each of its phases: ``staging_s`` (inputs), ``load_s`` (model weights on a cache miss),
  ``compute_s`` (denoising), ``finalize_s`` (post-processing while the GPUs stay booked). CSV columns:
  ``submit_s,gpus,model,staging_s,load_s,compute_s,finalize_s`` (:func:`load_trace`).
- The pool (:class:`ReplayConfig`) has ``nodes`` × ``gpus_per_node`` GPUs. Every ``pass_interval_s`` the
  scheduler's own :func:`~gpufleet.scheduler.cycle.run_cycle` (the ``fifo`` policy of
  :mod:`gpufleet.sim.queueing`) places PENDING jobs on the free GPUs; an unplaced job's reason is recorded
  as the real pass records ``sched_reason``, one :class:`~gpufleet.diagnose.attribution.PendingInterval`
  per run of the same reason.
- A placed job's marks follow :mod:`gpufleet.phases`: ``dispatched`` after ``dispatch_s``, ``started`` after
  ``start_s`` more, ``inputs_staged`` after its staging, ``model_loaded`` after ``load_s`` when the node's
  cache misses its model (``cache="cold"``: a node caches a model once it loaded it; ``"warm"``: every node
  has every model, so no load), ``first_step``/``generation_done`` across its compute; its GPUs are
  released ``finalize_s`` later, seen by the next pass.
- :func:`replay` returns the :class:`~gpufleet.diagnose.attribution.Inputs` over ``[0, makespan)`` (the same
  values the store reader builds from the tables, so :func:`~gpufleet.diagnose.attribution.attribute`
  gives the same attribution) and what was injected (GPU-seconds of staging and model loads).
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.diagnose.attribution import Booking, Inputs, NodeInventory, PendingInterval
from gpufleet.errors import ValidationFailed
from gpufleet.pools import parse_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.model import NodeState, PendingJob, Snapshot
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.sim.queueing import POLICIES

POOL = "onprem"
COLUMNS = ("submit_s", "gpus", "model", "staging_s", "load_s", "compute_s", "finalize_s")


@dataclass(frozen=True)
class TraceJob:
    submit_s: float
    gpus: int
    model: str
    staging_s: float
    load_s: float
    compute_s: float
    finalize_s: float


@dataclass(frozen=True)
class ReplayConfig:
    nodes: int = 2
    gpus_per_node: int = 4
    pass_interval_s: float = 5.0
    dispatch_s: float = 1.0
    start_s: float = 2.0
    cache: str = "cold"  # cold | warm


@dataclass
class ReplayResult:
    inputs: Inputs
    #: cause value -> GPU-seconds the trace put there (staging, model_load)
    injected: dict[str, float] = field(default_factory=dict)
    makespan_s: float = 0.0


def load_trace(path: Path) -> list[TraceJob]:
    """Trace rows of a CSV with :data:`COLUMNS`; a malformed row raises ``ValidationFailed`` naming its line."""
    try:
        fh = open(path, newline="")
    except OSError as err:
        raise ValidationFailed(f"cannot read trace {path}: {err}") from err
    out = []
    with fh:
        reader = csv.DictReader(fh)
        missing = set(COLUMNS) - set(reader.fieldnames or [])
        if missing:
            raise ValidationFailed(f"{path}: missing columns {sorted(missing)}")
        for ln, r in enumerate(reader, start=2):
            try:
                out.append(TraceJob(float(r["submit_s"]), int(r["gpus"]), r["model"], float(r["staging_s"]),
                                    float(r["load_s"]), float(r["compute_s"]), float(r["finalize_s"])))
            except ValueError as err:
                raise ValidationFailed(f"{path}:{ln}: {err}") from err
    return out


def synthetic_trace(jobs: int = 24, *, seed: int = 0, staging_s: float = 3.0, load_s: float = 8.0,
                    models: int = 3, mean_gap_s: float = 4.0) -> list[TraceJob]:
    """A seeded trace of short video jobs (1, 2 or 4 GPUs) arriving faster than the pool serves them."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(1 / mean_gap_s)
        out.append(TraceJob(round(t, 3), rng.choice((1, 1, 2, 4)), f"model-{rng.randrange(models)}", staging_s,
                            load_s, round(rng.uniform(6, 14), 3), round(rng.uniform(1, 3), 3)))
    return out


def replay(trace: list[TraceJob], cfg: ReplayConfig | None = None) -> ReplayResult:
    """Run ``trace`` through the scheduler on ``cfg``'s pool; the attribution inputs over ``[0, makespan)``."""
    cfg = cfg or ReplayConfig()
    if cfg.cache not in ("cold", "warm"):
        raise ValidationFailed(f"cache must be cold or warm, got {cfg.cache!r}")
    too_big = [j for j in trace if j.gpus > cfg.gpus_per_node or j.gpus < 1]
    if too_big:
        raise ValidationFailed(f"{len(too_big)} job(s) want more GPUs than a node has ({cfg.gpus_per_node})")
    pools = parse_pools([{"name": POOL, "kind": "onprem", "region": "dc1", "gpu_type": "L4",
                          "max_gpus": cfg.nodes * cfg.gpus_per_node, "price_per_gpu_hour": 0.0}])
    free = [[True] * cfg.gpus_per_node for _ in range(cfg.nodes)]
    cached: list[set[str]] = [set() for _ in range(cfg.nodes)]
    jobs = {f"j{i:05d}": j for i, j in enumerate(sorted(trace, key=lambda j: j.submit_s))}
    waiting: dict[str, float] = {}  # job id -> pending since
    reason: dict[str, tuple[float, str]] = {}  # job id -> (since, current reason)
    pending_out: list[PendingInterval] = []
    bookings: list[Booking] = []
    releases: list[tuple[float, int, tuple[int, ...]]] = []
    arrivals = list(jobs)
    injected = {"staging": 0.0, "model_load": 0.0}
    t, passes = 0.0, 0
    while arrivals or waiting or releases:
        for rel in [r for r in releases if r[0] <= t]:
            releases.remove(rel)
            for g in rel[2]:
                free[rel[1]][g] = True
        while arrivals and jobs[arrivals[0]].submit_s <= t:
            jid = arrivals.pop(0)
            waiting[jid] = jobs[jid].submit_s
        if waiting:
            passes += 1
            nodes = tuple(NodeState(f"n{i}", POOL, "L4", tuple(MILLI if f else 0 for f in free[i]), 10**7, 10**8)
                          for i in range(cfg.nodes))
            pend = tuple(PendingJob(jid, "sim", "team", "u", created_at=since, pending_since=since,
                                    num_gpu=jobs[jid].gpus, cpu_milli=0, memory_mib=0, model=jobs[jid].model)
                         for jid, since in waiting.items())
            result = run_cycle(Snapshot(now=t, jobs=pend, nodes=nodes, pools=pools, quotas={}, usage={}, running=(),
                                        pool_used={}), POLICIES["fifo"], seed=passes)
            for p in result.placements:
                jid, member = p.job.job_id, p.members[0]
                node, gpus = int(member.node[1:]), tuple(member.gpu_indices)
                for g in gpus:
                    free[node][g] = False
                _close(pending_out, jid, jobs[jid].gpus, reason, waiting.pop(jid), t)
                bookings.append(_booking(jid, jobs[jid], node, gpus, t, cfg, cached[node], injected))
                releases.append((bookings[-1].end, node, gpus))
            for jid in waiting:
                why = result.status[jid].reason if jid in result.status else ""
                since, was = reason.get(jid, (waiting[jid], why))
                if was != why:
                    pending_out.append(PendingInterval(jid, since, t, jobs[jid].gpus, (POOL,), was))
                    since = t
                reason[jid] = (since, why)
        nxt = [r[0] for r in releases] + ([jobs[arrivals[0]].submit_s] if arrivals else [])
        if waiting:
            t += cfg.pass_interval_s
        elif nxt:  # an idle pool: the next pass is the first one after the next arrival or release
            t += cfg.pass_interval_s * max(1, -(-(min(nxt) - t) // cfg.pass_interval_s))
        else:
            break
    makespan = max((b.end for b in bookings if b.end is not None), default=0.0)
    nodes_inv = tuple(NodeInventory(f"n{i}", POOL, cfg.gpus_per_node) for i in range(cfg.nodes))
    return ReplayResult(Inputs(0.0, max(makespan, 0.001), nodes_inv, tuple(bookings), tuple(pending_out)),
                        injected, makespan)


def _close(out: list[PendingInterval], jid: str, gpus: int, reason: dict[str, tuple[float, str]], since: float,
           t: float) -> None:
    start, why = reason.pop(jid, (since, ""))
    if t > start:
        out.append(PendingInterval(jid, start, t, gpus, (POOL,), why))


def _booking(jid: str, job: TraceJob, node: int, gpus: tuple[int, ...], t: float, cfg: ReplayConfig,
             cache: set[str], injected: dict[str, float]) -> Booking:
    marks = {"dispatched": t + cfg.dispatch_s}
    marks["started"] = marks["dispatched"] + cfg.start_s
    marks["inputs_staged"] = marks["started"] + job.staging_s
    injected["staging"] += job.staging_s * len(gpus)
    load = 0.0 if cfg.cache == "warm" or job.model in cache else job.load_s
    cache.add(job.model)
    injected["model_load"] += load * len(gpus)
    marks["model_loaded"] = marks["inputs_staged"] + load
    marks["first_step"] = marks["model_loaded"] + job.compute_s / 10
    marks["generation_done"] = marks["model_loaded"] + job.compute_s
    return Booking.with_marks(marks, job_id=jid, epoch=1, node_id=f"n{node}", gpus=gpus, start=t,
                              end=marks["generation_done"] + job.finalize_s)
