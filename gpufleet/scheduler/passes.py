"""One scheduler pass: lease → snapshot → cycle → commit → preempt → release lease.

Contract:
- The pass reads and writes only through :class:`PassStores` (the store ports of
  :mod:`gpufleet.store.snapshot`, :mod:`gpufleet.store.placements` and :mod:`gpufleet.store.lease`;
  :func:`gpufleet.store.scheduling.pass_stores` builds the DynamoDB ones).
- A pass runs for one shard (:class:`~gpufleet.scheduler.shards.PassShard`: its PENDING partitions and its
  on-prem nodes; cloud pools and quotas are global); the default is the one shard that owns everything. At most
  one pass per shard runs at a time: the shard's lease (``PassStores.lease``, built for that shard) is acquired
  first; a pass that cannot get it returns ``skipped=True`` and does nothing. The commit transactions stay safe
  even without the lease (passes racing cannot overcommit), the lease only avoids wasted work.
- Placements are committed in ``lanes`` parallel lanes (:func:`gpufleet.scheduler.commits.commit_lanes`: each
  lane reserves its quota into its own escrow, then group-commits, ``group`` per transaction, falling back to one
  transaction each when a group is cancelled); a lost race leaves that job PENDING for the next pass.
  Preemptions are requested after the placements.
- UNRESOLVABLE and ERROR decisions record a backoff on the job item, with its reason, counting the job's
  scheduling attempts (the backoff's exponent) in the same conditional write; an UNRESOLVABLE one also records
  the cluster shape it was judged on (``CycleResult.shape``), so a pass that sees another shape considers the job
  again before its backoff ends (``PassReport.woken``). An UNSCHEDULABLE job not backing off shows its reason
  (written when it changes); a job backing off keeps the reason its backoff recorded.
- Preemption requests, backoffs and wait reasons (one UpdateItem each, on different items) are written
  ``write_parallelism`` at a time (default :data:`WRITE_PARALLELISM`; the Lambda's
  ``GPUFLEET_SCHEDULER_WRITE_PARALLELISM``).
- After the commit, the pass's queue view (:mod:`gpufleet.scheduler.queueview`: positions and
  estimated starts of the jobs left PENDING) is written to ``PassStores.queue`` (best effort).
- A job whose spec ``deadline`` passed before it ever started is not considered: its placement
  token is failed with ``EXPIRED`` (:meth:`PlacementStore.expire`), and the workflow ends it EXPIRED.
- The report (:class:`PassReport`: durations, jobs considered/placed, left PENDING by result, GPUs
  free and fragmented per pool after the placements, :mod:`gpufleet.scheduler.capacity`) is
  returned and, when ``metrics`` is given, written as one JSON log line (``"event":
  "scheduler_pass"``) and as the scheduler metrics of :mod:`gpufleet.metrics.catalog` (EMF).
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from gpufleet.clock import Clock
from gpufleet.errors import TransientError
from gpufleet.metrics import catalog as M
from gpufleet.metrics.emf import MAX_VALUES, Metrics
from gpufleet.pools import Pool
from gpufleet.scheduler import queueview
from gpufleet.scheduler.capacity import pool_capacity
from gpufleet.scheduler.commits import commit_lanes, recover
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.scheduler.shards import PassShard
from gpufleet.store.lease import Lease
from gpufleet.store.placements import PlacementStore
from gpufleet.store.queueview import QueueViewStore
from gpufleet.store.snapshot import SnapshotReader

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassStores:
    """What a pass reads and writes: the snapshot, the placement writes, the one-pass lease."""

    snapshot: SnapshotReader
    placements: PlacementStore
    lease: Lease
    #: where the pass's queue view goes (positions, estimated starts); None: not kept
    queue: QueueViewStore | None = None


@dataclass
class PassReport:
    skipped: bool = False
    #: the shard this pass ran for (:meth:`PassShard.as_dict`)
    shard: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    placed: int = 0
    lost: int = 0
    preempted: int = 0
    backoffs: int = 0
    #: jobs backing off that were considered early because the cluster's static shape changed
    woken: int = 0
    expired: int = 0
    snapshot_s: float = 0.0
    cycle_s: float = 0.0
    commit_s: float = 0.0
    lost_reasons: list[str] = field(default_factory=list)
    considered: int = 0
    #: jobs left PENDING by result (:data:`UNPLACED_REASONS`)
    unplaced: dict[str, int] = field(default_factory=dict)
    placed_by_pool: dict[str, int] = field(default_factory=dict)
    #: seconds PENDING → placed of each committed placement, by pool
    waits: dict[str, list[float]] = field(default_factory=dict)
    free_gpus: dict[str, float] = field(default_factory=dict)
    fragmented_gpus: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lost_reasons"] = d["lost_reasons"][:10]
        d.pop("waits")
        return d


#: Why a considered job stayed PENDING: the cycle's result (:class:`~gpufleet.scheduler.results.Outcome`
#: other than fits) or ``lost`` (its commit lost a race). The ``Reason`` of ``UnschedulableJobs``.
UNPLACED_REASONS = ("unschedulable", "unresolvable", "error", "lost")


def emit_report(report: PassReport, pools: tuple[Pool, ...], metrics: Metrics) -> None:
    """Write ``report`` as its log line and its metrics (every pool and reason, zeros included, so a
    quiet pool reads 0 rather than missing data)."""
    metrics.log("scheduler_pass", report.as_dict())
    metrics.put(M.PENDING_JOBS, report.pending)
    metrics.put(M.JOBS_CONSIDERED, report.considered)
    metrics.put(M.PASS_SECONDS, report.snapshot_s + report.cycle_s + report.commit_s)
    for reason in UNPLACED_REASONS:
        metrics.put(M.UNSCHEDULABLE, report.unplaced.get(reason, 0), {M.REASON: reason})
    for pool in pools:
        dims = {M.POOL: pool.name}
        metrics.put(M.PLACEMENTS, report.placed_by_pool.get(pool.name, 0), dims)
        waits = report.waits.get(pool.name, [])
        for i in range(0, len(waits), MAX_VALUES):
            metrics.put(M.QUEUE_WAIT, waits[i: i + MAX_VALUES], dims)
        if pool.name in report.free_gpus:
            metrics.put(M.FREE_GPUS, report.free_gpus[pool.name], dims)
            metrics.put(M.FRAGMENTED_GPUS, report.fragmented_gpus[pool.name], dims)


#: how many commit lanes a pass runs side by side (each its own escrow item and transactions in turn)
COMMIT_LANES = 4

#: how many of a pass's independent single-item writes (preemption requests, backoffs, wait reasons) are in
#: flight at once: each is one UpdateItem on its own job item, so they never contend; after a burst the first
#: pass writes a reason for every job left waiting (tens of thousands at scale), one after another too slow
WRITE_PARALLELISM = 16


def _in_parallel(write, args: list, workers: int = WRITE_PARALLELISM) -> list:
    """``write(a)`` for each of ``args``, up to ``workers`` at once; the results in order. The first error is raised
    once every write has been tried (as a loop would raise it, but without skipping the rest)."""
    if len(args) <= 1 or workers <= 1:
        results, errors = [], []
        for a in args:
            try:
                results.append(write(a))
            except Exception as err:  # noqa: BLE001 - raised below, after the rest were tried
                errors.append(err)
                results.append(None)
        if errors:
            raise errors[0]
        return results
    with ThreadPoolExecutor(max_workers=min(workers, len(args))) as pool:
        futures = [pool.submit(write, a) for a in args]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def _expire(snap, placements: PlacementStore, now: float, report: PassReport):
    """Jobs whose spec ``deadline`` passed before they ever started (no attempt yet) are not considered:
    their placement token is failed with ``EXPIRED`` (ClassifyFailure ends them EXPIRED, not charged)."""
    late = [j for j in snap.jobs if j.deadline is not None and j.deadline <= now and j.attempts == 0]
    if not late:
        return snap
    for job in late:
        if placements.expire(job.job_id, job.placement_token, "the deadline passed before the job started"):
            report.expired += 1
    gone = {j.job_id for j in late}
    return replace(snap, jobs=type(snap.jobs)(j for j in snap.jobs if j.job_id not in gone))


def run_pass(
    stores: PassStores,
    *,
    pools: tuple[Pool, ...],
    clock: Clock,
    config: SchedulerConfig | None = None,
    seed: int = 0,
    use_lease: bool = True,
    lease_ttl_s: float = 300.0,
    owner: str | None = None,
    group: int = 20,
    metrics: Metrics | None = None,
    pass_interval_s: float = 60.0,
    write_parallelism: int = WRITE_PARALLELISM,
    shard: PassShard | None = None,
    lanes: int = COMMIT_LANES,
    lane_parallelism: int = 1,
) -> PassReport:
    """Run one pass (see module docstring). ``pass_interval_s``: the cadence the queue view's estimated
    starts assume (the timer's period). ``shard``: the part of the cluster this pass owns (default: all of it;
    ``stores.lease`` must be that shard's lease). ``lanes``: commit lanes, ``lane_parallelism`` of them at once
    (1, the default, one after another: moto's in-process DynamoDB copies tables inside a transaction and is not
    safe for concurrent ones; the Lambda runs them side by side)."""
    owner = owner or uuid.uuid4().hex
    shard = shard or PassShard()
    report = PassReport(shard=shard.as_dict())
    if use_lease and not stores.lease.acquire(owner, clock.now(), lease_ttl_s):
        report.skipped = True
        return report
    try:
        t0 = time.perf_counter()
        recover(stores.placements, shard.lanes(lanes))
        snap = stores.snapshot.load(pools, clock.now(), shard=shard)
        report.pending = len(snap.jobs)
        snap = _expire(snap, stores.placements, clock.now(), report)
        t1 = time.perf_counter()
        result = run_cycle(snap, config, seed=seed)
        t2 = time.perf_counter()
        report.considered = len(result.status)
        report.woken = result.woken
        by_job = {p.job.job_id: p for p in result.placements}
        committed = []
        now = clock.now()
        for res in commit_lanes(stores.placements, result.placements, snap.quotas, now, lanes=shard.lanes(lanes),
                                group=group, parallelism=lane_parallelism):
            if res.ok:
                report.placed += 1
                p = by_job.get(res.job_id)
                if p is not None:
                    committed.append(p)
                    pool = p.pool.name
                    report.placed_by_pool[pool] = report.placed_by_pool.get(pool, 0) + 1
                    report.waits.setdefault(pool, []).append(max(0.0, now - p.job.pending_since))
            else:
                report.lost += 1
                report.lost_reasons.append(f"{res.job_id}: {res.reason}")
        for st in result.status.values():
            if not st.ok:
                report.unplaced[st.outcome.value] = report.unplaced.get(st.outcome.value, 0) + 1
        if report.lost:
            report.unplaced["lost"] = report.lost
        for name, cap in pool_capacity(snap, committed).items():
            report.free_gpus[name], report.fragmented_gpus[name] = cap.free_gpus, cap.fragmented_gpus
        requested = _in_parallel(lambda vb: stores.placements.request_preemption(vb[0], vb[1], clock.now()),
                                 result.preemptions, write_parallelism)
        report.preempted += sum(1 for ok in requested if ok)
        backoffs = [(job_id, clock.now() + rq.delay_s, st.reason, result.shape if st.outcome.value == "unresolvable" else "")
                    for job_id, rq in result.requeue.items()
                    if rq.backoff and rq.delay_s > 0 and (st := result.status[job_id]).outcome.value in ("unresolvable", "error")]
        _in_parallel(lambda b: stores.placements.record_backoff(*b), backoffs, write_parallelism)
        report.backoffs += len(backoffs)
        # a job that could fit but not now (capacity, quota) shows why it waits; written when the reason changes.
        # A job backing off keeps the reason its backoff recorded (its status this pass is only "backing off").
        waiting = {j.job_id: j for j in snap.jobs}
        reasons = [(job_id, st.reason) for job_id, st in result.status.items()
                   if (job := waiting.get(job_id)) is not None and st.outcome.value == "unschedulable" and st.reason
                   and job.backoff_until <= snap.now and st.reason != job.wait_reason]
        _in_parallel(lambda r: stores.placements.record_reason(*r), reasons, write_parallelism)
        if stores.queue is not None:
            view = queueview.build(snap.jobs, result.order, {p.job.job_id for p in committed}, now,
                                   pass_interval_s=pass_interval_s)
            try:
                stores.queue.put(view)
            except TransientError as err:  # the view is advisory: the next pass writes it again
                _log.warning("queue view not written: %s", err)
        report.snapshot_s, report.cycle_s, report.commit_s = t1 - t0, t2 - t1, time.perf_counter() - t2
        if metrics is not None:
            emit_report(report, pools, metrics)
        return report
    finally:
        if use_lease:
            stores.lease.release(owner)
