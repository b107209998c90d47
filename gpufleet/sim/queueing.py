"""Queueing simulator on the Philly trace: teams with quotas, an on-prem pool and a priced cloud burst pool.

Model:
- Jobs: Philly jobs submitted in ``[start_day, start_day + days)`` (days since the trace's
  first submission), durations capped at ``max_duration_h``; a job of more than
  ``gpus_per_node`` GPUs is a gang of whole nodes. Virtual clusters are teams of one tenant.
- Cluster: an on-prem pool of ``onprem_nodes`` × ``gpus_per_node`` GPUs (default: sized to
  ``load`` × the window's mean GPU demand) and a cloud pool of ``cloud_gpus`` GPUs at
  ``cloud_price`` $/GPU-hour (on-prem GPUs are sunk cost here).
- Quotas: each team's guarantee is its share of the window's GPU-time, applied to the
  on-prem capacity; borrowing up to the whole cluster.
- Scheduling: every ``pass_interval_s`` (when something changed) the scheduler's own
  ``run_cycle`` runs on a snapshot of the simulated cluster. Policies (``POLICIES``):
  ``fifo`` (arrival order, no quotas, best-fit), ``drf`` (weighted DRF order, quota
  limits, best-fit) and ``ours`` (DRF with stepped aging, reclaim preemption of
  borrowed capacity, fragmentation-aware packing).
- Preemption: the victim loses the work since its last checkpoint (every
  ``checkpoint_s``) and is requeued.
Metrics: average JCT, p50/p99 queue wait (first start − submission), on-prem GPU
utilisation over the submission window, cloud cost, preemptions, and Jain's fairness index of
usage/entitlement over the teams with demand, averaged over time (and the same with each team's
entitlement capped at what its pending and running jobs ask: ``fairness_demand_capped``).
``borrow_cap`` limits what a team may borrow beyond its guarantee (a multiple of it, at least what
its widest job needs; default: the whole cluster).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpufleet.pools import parse_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.scheduler.model import ALL_TYPES, Allocation, Member, NodeState, PendingJob, QuotaNode, Snapshot
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.sim.traces import PhillyJob

TENANT = "philly"
POLICIES: dict[str, SchedulerConfig] = {
    "fifo": SchedulerConfig(
        queue_sort="fifo",
        filters=("gpu-type", "residency", "fits-ever"),
        preempt=None,
        packing="best-fit",
        max_jobs_per_pass=400,
    ),
    "drf": SchedulerConfig(queue_sort="drf", preempt=None, packing="best-fit", max_jobs_per_pass=400),
    "ours": SchedulerConfig(
        queue_sort="drf-aging",
        preempt="reclaim",
        packing="frag-aware",
        aging_per_minute=0.02,  # +10 points per 500 min waited
        starvation_s=6 * 3600,
        preemption_window_s=4 * 3600,
        max_jobs_per_pass=400,
    ),
}


@dataclass
class QueueingConfig:
    start_day: float = 40.0
    days: float = 2.0
    max_duration_h: float = 24.0
    gpus_per_node: int = 8
    onprem_nodes: int | None = None
    load: float = 1.25  # mean demand / on-prem capacity when onprem_nodes is None
    cloud_gpus: int = 32
    cloud_price: float = 2.5
    pass_interval_s: float = 300.0
    checkpoint_s: float = 1800.0
    limit_jobs: int | None = None
    #: a team may borrow up to this multiple of its guarantee beyond it (None: up to the whole cluster)
    borrow_cap: float | None = None


@dataclass
class SimJob:
    job_id: str
    team: str
    submit: float
    duration: float
    gpus: int
    remaining: float = 0.0
    first_start: float | None = None
    finish: float | None = None
    started_at: float = 0.0
    run_id: int = 0
    placement: tuple | None = None  # (pool, members, gpu_type)
    last_preempted_at: float | None = None
    pending_since: float = 0.0
    preemptions: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """(members, GPUs per member)."""
        return (1, self.gpus) if self.gpus <= 8 else (math.ceil(self.gpus / 8), 8)


@dataclass
class QueueingResult:
    policy: str
    jobs: int
    avg_jct_h: float
    p50_wait_h: float
    p99_wait_h: float
    utilization: float
    cloud_cost: float
    fairness: float
    preemptions: int
    lost_gpu_h: float
    makespan_h: float
    passes: int
    #: Jain over usage / min(entitlement, GPUs the team's pending + running jobs ask): a team whose jobs all run counts as served
    fairness_demand_capped: float = 1.0
    timeline: list[tuple[float, float, float]] = field(default_factory=list)  # (t, onprem busy GPUs, jain)

    def headline(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "timeline"}
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


def select_jobs(trace: list[PhillyJob], cfg: QueueingConfig) -> list[SimJob]:
    lo, hi = cfg.start_day * 86400, (cfg.start_day + cfg.days) * 86400
    chosen = [j for j in trace if lo <= j.submit_s < hi]
    if cfg.limit_jobs is not None:
        chosen = chosen[: cfg.limit_jobs]
    cap = cfg.max_duration_h * 3600
    out = []
    for i, j in enumerate(chosen):
        g = (
            j.num_gpus
            if j.num_gpus <= cfg.gpus_per_node
            else cfg.gpus_per_node * math.ceil(j.num_gpus / cfg.gpus_per_node)
        )
        d = max(1.0, min(j.duration_s, cap))
        out.append(SimJob(f"p{i:06d}", j.cluster, j.submit_s - lo, d, g, remaining=d))
    return out


def entitlements(jobs: list[SimJob], capacity_milli: int) -> dict[str, int]:
    demand: dict[str, float] = defaultdict(float)
    for j in jobs:
        demand[j.team] += j.duration * j.gpus
    total = sum(demand.values()) or 1.0
    return {t: max(MILLI // 4, int(capacity_milli * d / total)) for t, d in demand.items()}


def jain(x: list[float]) -> float:
    if not x:
        return 1.0
    a = np.array(x, dtype=float)
    s2 = float((a * a).sum())
    return float(a.sum() ** 2 / (len(a) * s2)) if s2 > 0 else 1.0


def simulate_queueing(
    trace: list[PhillyJob], policy: str, cfg: QueueingConfig | None = None, seed: int = 0
) -> QueueingResult:
    cfg = cfg or QueueingConfig()
    sched = POLICIES[policy]
    jobs = select_jobs(trace, cfg)
    if not jobs:
        raise ValueError("no jobs in the selected window")
    window = cfg.days * 86400
    mean_demand = sum(j.duration * j.gpus for j in jobs) / window
    n_nodes = cfg.onprem_nodes or max(2, int(round(mean_demand / cfg.load / cfg.gpus_per_node)))
    onprem_gpus = n_nodes * cfg.gpus_per_node
    pools = parse_pools(
        [
            {
                "name": "onprem",
                "kind": "onprem",
                "region": "dc1",
                "gpu_type": "V100",
                "max_gpus": onprem_gpus,
                "price_per_gpu_hour": 0.0,
            },
            {
                "name": "cloud",
                "kind": "ondemand",
                "region": "dc1",
                "gpu_type": "A10G",
                "max_gpus": cfg.cloud_gpus,
                "price_per_gpu_hour": cfg.cloud_price,
                "cold_start_s": 120,
                "job_queue": "burst",
                "job_definition": "jd",
            },
        ]
    )
    ent = entitlements(jobs, onprem_gpus * MILLI)
    use_quota = policy != "fifo"
    whole = (onprem_gpus + cfg.cloud_gpus) * MILLI

    widest: dict[str, int] = defaultdict(int)
    for j in jobs:
        widest[j.team] = max(widest[j.team], j.gpus * MILLI)

    def borrow(t: str, g: int) -> int:  # never so little that the team's widest job can not run
        return whole if cfg.borrow_cap is None else min(whole, max(int(cfg.borrow_cap * g), widest[t] - g))

    quotas = (
        {
            f"{TENANT}/{t}": QuotaNode(f"{TENANT}/{t}", {ALL_TYPES: g}, {ALL_TYPES: borrow(t, g)}, {})
            for t, g in ent.items()
        }
        if use_quota
        else {}
    )
    free = np.full((n_nodes, cfg.gpus_per_node), MILLI, dtype=np.int64)
    cloud_used = 0
    by_id = {j.job_id: j for j in jobs}
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    ai = 0
    pending: dict[str, SimJob] = {}
    running: dict[str, SimJob] = {}
    done: heapq = []  # (finish time, run id, job id)
    t = 0.0
    busy_gpu_s = 0.0
    cost = 0.0
    lost_gpu_s = 0.0
    preemptions = 0
    passes = 0
    fair_acc = fair_w = capped_acc = 0.0
    timeline = []
    last_t = 0.0
    changed = True
    usage: dict[str, int] = defaultdict(int)

    def onprem_busy() -> int:
        return int(n_nodes * cfg.gpus_per_node * MILLI - free.sum()) // MILLI

    def stop(j: SimJob, now: float) -> None:
        nonlocal cloud_used, cost
        pool, members, _ = j.placement
        members_n, per = j.shape
        if pool == "cloud":
            cloud_used -= j.gpus * MILLI
            cost += (now - j.started_at) / 3600 * j.gpus * cfg.cloud_price
        else:
            for node, gpus in members:
                for g in gpus:
                    free[node, g] += MILLI
        usage[j.team] -= j.gpus * MILLI
        j.placement = None
        running.pop(j.job_id, None)

    next_pass = 0.0
    while ai < len(arrivals) or pending or running:
        nxt = []
        if ai < len(arrivals):
            nxt.append(arrivals[ai].submit)
        if done:
            nxt.append(done[0][0])
        if pending:
            nxt.append(next_pass)
        new_t = max(t, min(nxt))
        if new_t > last_t:
            dt = new_t - last_t
            busy_gpu_s += onprem_busy() * max(0.0, min(new_t, window) - min(last_t, window))
            demand_teams = {j.team for j in pending.values()} | {j.team for j in running.values()}
            fj = jain([usage[tm] / ent[tm] for tm in demand_teams])
            fair_acc += fj * dt
            fair_w += dt
            want: dict[str, int] = defaultdict(int)
            for j in (*pending.values(), *running.values()):
                want[j.team] += j.gpus * MILLI
            capped_acc += jain([usage[tm] / min(ent[tm], want[tm]) for tm in demand_teams]) * dt
            timeline.append((last_t, float(onprem_busy()), fj))
            last_t = new_t
        t = new_t
        while done and done[0][0] <= t:
            ft, run_id, jid = heapq.heappop(done)
            j = by_id[jid]
            if j.run_id != run_id or jid not in running:
                continue
            stop(j, ft)
            j.finish = ft
            j.remaining = 0.0
            changed = True
        while ai < len(arrivals) and arrivals[ai].submit <= t:
            j = arrivals[ai]
            j.pending_since = j.submit
            pending[j.job_id] = j
            ai += 1
            changed = True
        if not pending or t < next_pass:
            continue
        next_pass = t + cfg.pass_interval_s
        if not changed:
            if not running and ai >= len(arrivals):
                raise RuntimeError(f"{len(pending)} job(s) can never be placed")
            continue
        # scheduling pass
        passes += 1
        changed = False
        nodes = tuple(
            NodeState(f"n{i}", "onprem", "V100", tuple(int(x) for x in free[i]), 10**7, 10**8) for i in range(n_nodes)
        )
        pend = []
        for j in pending.values():
            members, per = j.shape
            pend.append(
                PendingJob(
                    j.job_id,
                    TENANT,
                    j.team,
                    "u",
                    priority=100,
                    created_at=j.submit,
                    pending_since=j.pending_since,
                    num_gpu=per,
                    gpu_milli=MILLI,
                    cpu_milli=0,
                    memory_mib=0,
                    nodes=members,
                    last_preempted_at=j.last_preempted_at,
                )
            )
        allocs = []
        for j in running.values():
            pool, members, gtype = j.placement
            if pool != "onprem":
                continue
            done_s = t - j.started_at
            ckpt = j.started_at + (done_s // cfg.checkpoint_s) * cfg.checkpoint_s
            allocs.append(
                Allocation(
                    j.job_id,
                    j.run_id,
                    f"{TENANT}/{j.team}/u",
                    100,
                    "onprem",
                    "V100",
                    tuple(Member(f"n{n}", tuple(g)) for n, g in members),
                    MILLI,
                    j.shape[1],
                    started_at=j.started_at,
                    checkpoint_at=ckpt,
                    last_preempted_at=j.last_preempted_at,
                )
            )
        snap = Snapshot(
            now=t,
            jobs=tuple(pend),
            nodes=nodes,
            pools=pools,
            quotas=quotas,
            usage={f"{TENANT}/{tm}": {ALL_TYPES: u, "V100": u} for tm, u in usage.items()} if use_quota else {},
            running=tuple(allocs),
            pool_used={"cloud": cloud_used},
        )
        result = run_cycle(snap, sched, seed=seed + passes)
        for victim, _ in result.preemptions:
            j = by_id[victim.job_id]
            if j.job_id not in running:
                continue
            done_s = t - j.started_at
            kept = (done_s // cfg.checkpoint_s) * cfg.checkpoint_s
            lost_gpu_s += (done_s - kept) * j.gpus
            j.remaining -= kept
            stop(j, t)
            j.run_id += 1
            j.last_preempted_at = t
            j.pending_since = t
            j.preemptions += 1
            preemptions += 1
            pending[j.job_id] = j
            changed = True
        for p in result.placements:
            j = by_id[p.job.job_id]
            if p.pool.kind.is_cloud:
                cloud_used += j.gpus * MILLI
                members = ()
            else:
                members = tuple((int(m.node[1:]), tuple(m.gpu_indices)) for m in p.members)
                for node, gpus in members:
                    for g in gpus:
                        assert free[node, g] == MILLI
                        free[node, g] = 0
            j.placement = (p.pool.name, members, p.gpu_type)
            j.started_at = t
            if j.first_start is None:
                j.first_start = t
            j.run_id += 1
            usage[j.team] += j.gpus * MILLI
            running[j.job_id] = j
            del pending[j.job_id]
            heapq.heappush(done, (t + j.remaining, j.run_id, j.job_id))
    waits = np.array([j.first_start - j.submit for j in jobs]) / 3600
    jct = np.array([j.finish - j.submit for j in jobs]) / 3600
    makespan = max(j.finish for j in jobs)
    return QueueingResult(
        policy=policy,
        jobs=len(jobs),
        avg_jct_h=float(jct.mean()),
        p50_wait_h=float(np.percentile(waits, 50)),
        p99_wait_h=float(np.percentile(waits, 99)),
        utilization=busy_gpu_s / (onprem_gpus * window),
        cloud_cost=cost,
        fairness=fair_acc / fair_w if fair_w else 1.0,
        fairness_demand_capped=capped_acc / fair_w if fair_w else 1.0,
        preemptions=preemptions,
        lost_gpu_h=lost_gpu_s / 3600,
        makespan_h=makespan / 3600,
        passes=passes,
        timeline=timeline,
    )
