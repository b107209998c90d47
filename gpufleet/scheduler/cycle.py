"""The scheduling cycle: one pass over a snapshot, in numbered steps (pure).

``run_cycle(snapshot, config, seed)`` returns a :class:`CycleResult`: the
placements to commit, the preemptions to request, and a :class:`Status` plus
:class:`Requeue` for every job considered. It never does I/O; the store commits
the placements (step 6) and may find some no longer valid (another pass won a
race): those jobs simply stay PENDING.

Steps per job, in the order of step 1 (queue sort):
 2. filter pools (hard constraints; none left ever → UNRESOLVABLE). Only the pools of
    the job's allowlist (``PendingJob.pools``; empty = all) are considered at all, by
    every later step too; an allowlist naming no configured pool → UNRESOLVABLE;
 3. score the remaining pools with the job's policy (or its tenant's default);
 4. reserve in the best pool that has room (gang: all members or none). A job with
    ``avoid_nodes`` (nodes an earlier attempt crashed or was lost on) is first tried
    with those nodes excluded in every ranked pool; only if that places it nowhere is
    it tried again with them allowed (still preferring the other nodes per member);
 5. if nothing has room: preempt (victims chosen, the job waits) or stay queued.
A job that has waited longer than ``starvation_s`` and still does not fit blocks
backfill onto its pools for the rest of the pass, so large jobs are not starved
by a stream of small ones. A plugin exception becomes ERROR for that job only.
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpufleet.pools import Pool, PoolKind
from gpufleet.scheduler.fragmentation import TaskMix
from gpufleet.scheduler.framework import SchedulerConfig, build
from gpufleet.scheduler.model import ANY, Allocation, Member, NodeState, PendingJob, Snapshot, allowed_pools
from gpufleet.scheduler.nodetable import MAX_GPUS, MILLI, NodeTable, Request
from gpufleet.scheduler.packing import make_policy
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.scheduler.results import FITS, Outcome, Requeue, Status, requeue_for


@dataclass(frozen=True)
class Placement:
    """A reservation made by the pass (not yet committed)."""

    job: PendingJob
    pool: Pool
    gpu_type: str
    members: tuple[Member, ...]
    charge_milli: int

    @property
    def target(self) -> str:
        return "cloud" if self.pool.kind.is_cloud else "onprem"

    def to_json(self, epoch: int) -> dict:
        """The placement document of docs/contracts.md (plus ``members`` for gangs)."""
        first = self.members[0]
        doc = {
            "epoch": epoch,
            "attempt": epoch,
            "target": self.target,
            "pool": self.pool.name,
            "node": first.node,
            "queue_url": first.queue_url or None,
            "job_queue": self.pool.job_queue,
            "job_definition": self.pool.job_definition,
            "gpu_indices": list(first.gpu_indices),
            "gpu_milli": self.job.gpu_milli if self.job.num_gpu else 0,
            "gpu_type": self.gpu_type,
            "price_per_gpu_hour": self.pool.price_per_gpu_hour,
        }
        if len(self.members) > 1:
            doc["members"] = [
                {"node": m.node, "queue_url": m.queue_url or None, "gpu_indices": list(m.gpu_indices)} for m in self.members
            ]
        return doc


@dataclass
class CycleResult:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[tuple[Allocation, str]] = field(default_factory=list)  # (victim, for job id)
    status: dict[str, Status] = field(default_factory=dict)
    requeue: dict[str, Requeue] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def _node_table(nodes: list[NodeState]) -> NodeTable:
    return NodeTable(
        [n.node_id for n in nodes],
        [n.gpu_type for n in nodes],
        [n.cpu_milli_free for n in nodes],
        [n.memory_mib_free for n in nodes],
        [min(len(n.gpu_free), MAX_GPUS) for n in nodes],
        gpu_free=np.array([list(n.gpu_free[:MAX_GPUS]) + [0] * (MAX_GPUS - min(len(n.gpu_free), MAX_GPUS)) for n in nodes]).reshape(
            len(nodes), MAX_GPUS
        ),
    )


class PassContext:
    """Working state of one pass: per-pool node tables, pool usage, quota ledger, plugins."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, seed: int = 0) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = snapshot.now
        self.rng = np.random.default_rng(seed)
        self.pools = {p.name: p for p in snapshot.pools}
        self.ledger = QuotaLedger(snapshot.quotas, snapshot.usage)
        self.pool_used: dict[str, int] = defaultdict(int, snapshot.pool_used)
        self.placed_to: Counter[str] = Counter()
        self.running = list(snapshot.running)
        self.preempting: set[str] = {a.job_id for a in snapshot.running if a.preempt_requested}
        by_pool: dict[str, list[NodeState]] = defaultdict(list)
        for n in snapshot.nodes:
            if n.usable(self.now) and n.pool in self.pools and self.pools[n.pool].kind is PoolKind.ONPREM:
                by_pool[n.pool].append(n)
        self.nodes_by_pool = dict(by_pool)
        self.tables = {p: _node_table(ns) for p, ns in by_pool.items()}
        self.node_index = {p: {n.node_id: i for i, n in enumerate(ns)} for p, ns in by_pool.items()}
        self._queue_url = {n.node_id: n.queue_url for n in snapshot.nodes}
        self._max_fit_cache: dict[tuple, int] = {}
        cap: Counter[str] = Counter()
        for p in snapshot.pools:
            if p.kind.is_cloud:
                cap[p.gpu_type] += p.max_gpus * MILLI
        for ns in by_pool.values():
            for n in ns:
                cap[n.gpu_type] += len(n.gpu_free) * MILLI
        self.capacity_by_type = dict(cap)
        self.packer = make_policy(config.packing)
        reqs = [j.request for j in snapshot.jobs] + [
            Request(a.cpu_milli, a.memory_mib, a.num_gpu, a.gpu_milli if a.num_gpu else 0) for a in snapshot.running
        ]
        self.mix = TaskMix.from_requests(reqs) if reqs else None

    # -- helpers used by plugins ---------------------------------------------------
    def charge_milli(self, job: PendingJob, pool: Pool) -> int:
        """GPU milli charged to quota for ``job`` in ``pool`` (cloud rounds shares up to whole GPUs)."""
        if pool.kind.is_cloud:
            return job.nodes * job.num_gpu * MILLI
        return job.total_gpu_milli

    def queue_url(self, node_id: str) -> str:
        return self._queue_url.get(node_id, "")

    def pool_max_member_fit(self, pool: str, job: PendingJob) -> int:
        """How many distinct nodes of ``pool`` could hold one member if they were empty."""
        key = (pool, job.num_gpu, job.gpu_milli, job.cpu_milli, job.memory_mib, job.gpu_type)
        if key not in self._max_fit_cache:
            count = 0
            for n in self.nodes_by_pool.get(pool, []):
                type_ok = job.gpu_type in (ANY, n.gpu_type) or job.num_gpu == 0
                if type_ok and len(n.gpu_free) >= job.num_gpu:
                    count += 1
            self._max_fit_cache[key] = count
        return self._max_fit_cache[key]

    def pool_has_room(self, pool: str, job: PendingJob) -> bool:
        table = self.tables.get(pool)
        return table is not None and int(table.feasible(job.request).sum()) >= job.nodes

    def pool_data(self, pool: str) -> set[str]:
        out: set[str] = set()
        for n in self.nodes_by_pool.get(pool, []):
            out |= n.cached_models | n.datasets
        return out

    def preferred_nodes(self, pool: str, job: PendingJob) -> np.ndarray | None:
        """For locality jobs: nodes holding any of the job's inputs or its model (None = no preference)."""
        if self.policy_of(job) != "locality":
            return None
        wanted = set(job.inputs) | ({job.model} if job.model else set())
        if not wanted:
            return None
        mask = np.array([bool(wanted & (n.cached_models | n.datasets)) for n in self.nodes_by_pool.get(pool, [])], dtype=bool)
        return mask if mask.any() else None

    def avoid_mask(self, pool: str, job: PendingJob) -> np.ndarray | None:
        """Nodes of ``pool`` the job failed on earlier (None = none of them is in this pool)."""
        if not job.avoid_nodes:
            return None
        mask = np.array([n.node_id in job.avoid_nodes for n in self.nodes_by_pool.get(pool, [])], dtype=bool)
        return mask if mask.any() else None

    def policy_of(self, job: PendingJob) -> str:
        return job.policy or self.snapshot.tenant_policy.get(job.tenant) or self.config.default_policy


def _draw(job_id: str, attempts: int) -> float:
    return (zlib.crc32(f"{job_id}:{attempts}".encode()) % 10_000) / 10_000.0


def run_cycle(snapshot: Snapshot, config: SchedulerConfig | None = None, seed: int = 0) -> CycleResult:
    """One scheduling pass over ``snapshot`` (see module docstring)."""
    config = config or SchedulerConfig()
    ctx = PassContext(snapshot, config, seed)
    sorter = build("queue_sort", config.queue_sort)
    filters = [build("filter", f) for f in config.filters]
    reserve = build("reserve", config.reserve)
    preempt = build("preempt", config.preempt) if config.preempt else None
    scorers: dict[str, object] = {}
    out = CycleResult()
    eligible = [j for j in snapshot.jobs if j.backoff_until <= ctx.now]
    for j in snapshot.jobs:
        if j.backoff_until > ctx.now:
            out.status[j.job_id] = Status(Outcome.UNSCHEDULABLE, "backing off")
            out.requeue[j.job_id] = Requeue(j.backoff_until - ctx.now, backoff=True)
    ordered = sorter.sort(eligible, ctx)[: config.max_jobs_per_pass]
    blocked_pools: set[str] = set()
    for job in ordered:  # step 1 done: ordered
        out.order.append(job.job_id)
        try:
            status = _schedule_one(job, ctx, filters, reserve, preempt, scorers, blocked_pools, out)
        except Exception as err:  # a plugin bug must not stop the pass: ERROR → backoff
            status = Status(Outcome.ERROR, f"{type(err).__name__}: {err}")
        out.status[job.job_id] = status
        rq = requeue_for(status, job.attempts, _draw(job.job_id, job.attempts))
        if rq is not None:
            out.requeue[job.job_id] = rq
    return out


def _schedule_one(job, ctx: PassContext, filters, reserve, preempt, scorers, blocked_pools, out: CycleResult) -> Status:
    # step 2: filter (only the job's allowlisted pools exist for it from here on)
    candidates = allowed_pools(job, ctx.snapshot.pools)
    if not candidates:
        known = ", ".join(p.name for p in ctx.snapshot.pools)
        return Status(Outcome.UNRESOLVABLE, f"none of the job's pools ({', '.join(job.pools)}) exists; pools: {known}")
    static_ok: list[Pool] = []
    reasons: list[str] = []
    worst = Outcome.UNRESOLVABLE
    for pool in candidates:
        verdict = FITS
        for f in filters:
            verdict = f.filter(job, pool, ctx)
            if not verdict.ok:
                break
        if verdict.ok:
            static_ok.append(pool)
        else:
            reasons.append(verdict.reason)
            if verdict.outcome is Outcome.UNSCHEDULABLE:
                worst = Outcome.UNSCHEDULABLE
    typed = [p for p in candidates if _static(job, p, ctx)]
    if not static_ok:
        outcome = Outcome.UNSCHEDULABLE if typed else worst
        status = Status(outcome, "; ".join(reasons[:3]) or "no pool")
        if outcome is Outcome.UNSCHEDULABLE and preempt is not None:
            status = _try_preempt(job, typed, ctx, preempt, out) or status
        return status
    usable = [p for p in static_ok if p.name not in blocked_pools]
    # step 3: score
    name = ctx.policy_of(job)
    if name not in scorers:
        scorers[name] = build("score", name)
    ranked = sorted(usable, key=lambda p: (scorers[name].score(job, p, ctx), p.name))
    # step 4: reserve
    last = Status(Outcome.UNSCHEDULABLE, "blocked behind a starving job" if static_ok and not usable else "no room")
    for strict in (True, False) if job.avoid_nodes else (False,):
        for pool in ranked:
            got = reserve.reserve(job, pool, ctx, strict_avoid=strict)
            if isinstance(got, Placement):
                out.placements.append(got)
                return FITS
            last = got
    # step 5: preempt
    if preempt is not None:
        status = _try_preempt(job, static_ok, ctx, preempt, out)
        if status is not None:
            last = status
    if ctx.now - job.pending_since >= ctx.config.starvation_s:
        blocked_pools.update(p.name for p in static_ok if not p.kind.is_cloud)
    return last


_STATIC_FILTERS: list = []


def _static(job: PendingJob, pool: Pool, ctx: PassContext) -> bool:
    """Pools the job could use if quota and capacity allowed (type, residency, size)."""
    if not _STATIC_FILTERS:
        _STATIC_FILTERS.extend(build("filter", name) for name in ("gpu-type", "residency", "fits-ever"))
    return all(f.filter(job, pool, ctx).ok for f in _STATIC_FILTERS)


def _try_preempt(job, pools, ctx: PassContext, preempt, out: CycleResult) -> Status | None:
    victims, status = preempt.victims(job, pools, ctx)
    for v in victims:
        out.preemptions.append((v, job.job_id))
        ctx.preempting.add(v.job_id)
    return status
