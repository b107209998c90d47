"""The scheduling cycle: one pass over a snapshot, in numbered steps (pure).

``run_cycle(snapshot, framework, seed)`` runs the plugins of a
:class:`~gpufleet.scheduler.framework.Framework` (or of one built for this pass from a
:class:`~gpufleet.scheduler.framework.SchedulerConfig`; the defaults when None) and
returns a :class:`CycleResult`: the placements to commit, the preemptions to request, and a :class:`Status` plus
:class:`Requeue` for every job considered. It never does I/O; the store commits
the placements (step 6) and may find some no longer valid (another pass won a
race): those jobs simply stay PENDING.

Steps per job, in the order of step 1 (queue sort):
 2. the scopes narrow the pools the job is considered for at all, by every later step
    too (the always-on ``allowlist``: the job's ``PendingJob.pools``; empty = all; naming
    no configured pool → UNRESOLVABLE); the filters keep the usable ones (hard
    constraints; none left ever → UNRESOLVABLE, judged by the configured static filters);
 3. score the remaining pools with the job's policy (or its tenant's default);
 4. reserve in the best pool that has room (gang: all members or none). A job with
    ``avoid_nodes`` (nodes an earlier attempt crashed or was lost on) is first tried
    with those nodes excluded in every ranked pool; only if that places it nowhere is
    it tried again with them allowed (still preferring the other nodes per member);
 5. if nothing has room: preempt (victims chosen, the job waits) or stay queued.
A job that has waited longer than ``starvation_s`` and still does not fit blocks
backfill onto its pools for the rest of the pass, so large jobs are not starved
by a stream of small ones. A plugin exception becomes ERROR for that job only.

Backoff (:func:`~gpufleet.scheduler.results.requeue_for`): by the job's own scheduling attempts
(``PendingJob.sched_attempts``, one per UNRESOLVABLE/ERROR decision recorded), not its run attempts.
A job is considered when its backoff has ended, or, for one parked as UNRESOLVABLE, when the
snapshot's static shape (:func:`~gpufleet.scheduler.shape.cluster_shape`, ``CycleResult.shape``)
differs from the one its backoff recorded (``PendingJob.backoff_shape``): the cluster changed in a
way that may let it fit (``CycleResult.woken`` counts those).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from gpufleet.pools import Pool
from gpufleet.scheduler.context import PassContext, Placement
from gpufleet.scheduler.framework import Framework, SchedulerConfig
from gpufleet.scheduler.model import Allocation, PendingJob, Snapshot
from gpufleet.scheduler.plugins import Filter, Preempt
from gpufleet.scheduler.results import FITS, NO_VICTIMS, Outcome, Requeue, Status, requeue_for
from gpufleet.scheduler.shape import cluster_shape


@dataclass
class CycleResult:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[tuple[Allocation, str]] = field(default_factory=list)  # (victim, for job id)
    status: dict[str, Status] = field(default_factory=dict)
    requeue: dict[str, Requeue] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    #: the snapshot's static shape (:func:`~gpufleet.scheduler.shape.cluster_shape`): what an UNRESOLVABLE backoff records
    shape: str = ""
    #: jobs backing off that were considered because the shape changed since their backoff was recorded
    woken: int = 0


def _draw(job_id: str, attempts: int) -> float:
    return (zlib.crc32(f"{job_id}:{attempts}".encode()) % 10_000) / 10_000.0


def run_cycle(snapshot: Snapshot, framework: Framework | SchedulerConfig | None = None, seed: int = 0) -> CycleResult:
    """One scheduling pass over ``snapshot`` (see module docstring).

    ``framework``: the plugins to run, or a configuration to build them from for this
    pass (None: the default configuration)."""
    fw = framework if isinstance(framework, Framework) else Framework.from_config(framework)
    ctx = PassContext(snapshot, fw.config, fw.packer, seed)
    shape = cluster_shape(snapshot.pools, snapshot.nodes, ctx.now, (*fw.config.scopes, *fw.config.static_filters))
    out = CycleResult(shape=shape)
    eligible = []
    for j in snapshot.jobs:
        if j.backoff_until <= ctx.now:
            eligible.append(j)
        elif j.backoff_shape and j.backoff_shape != shape:
            eligible.append(j)
            out.woken += 1
        else:
            out.status[j.job_id] = Status(Outcome.UNSCHEDULABLE, "backing off")
            out.requeue[j.job_id] = Requeue(j.backoff_until - ctx.now, backoff=True)
    ordered = fw.queue_sort.sort(eligible, ctx)[: fw.config.max_jobs_per_pass]
    blocked_pools: set[str] = set()
    for job in ordered:  # step 1 done: ordered
        out.order.append(job.job_id)
        try:
            status = _schedule_one(job, ctx, fw, blocked_pools, out)
        except Exception as err:  # a plugin bug must not stop the pass: ERROR → backoff
            status = Status(Outcome.ERROR, f"{type(err).__name__}: {err}")
        out.status[job.job_id] = status
        rq = requeue_for(status, job.sched_attempts, _draw(job.job_id, job.sched_attempts))
        if rq is not None:
            out.requeue[job.job_id] = rq
    return out


def _schedule_one(job: PendingJob, ctx: PassContext, fw: Framework, blocked_pools: set[str], out: CycleResult) -> Status:
    # step 2: scopes (only the pools they leave exist for the job from here on), then filters
    candidates = list(ctx.snapshot.pools)
    for scope in fw.scopes:
        narrowed = scope.narrow(job, candidates, ctx)
        if isinstance(narrowed, Status):
            return narrowed
        candidates = narrowed
    static_ok: list[Pool] = []
    reasons: list[str] = []
    worst = Outcome.UNRESOLVABLE
    for pool in candidates:
        verdict = _verdict(fw.filters, job, pool, ctx)
        if verdict.ok:
            static_ok.append(pool)
        else:
            reasons.append(verdict.reason)
            if verdict.outcome is Outcome.UNSCHEDULABLE:
                worst = Outcome.UNSCHEDULABLE
    typed = [p for p in candidates if _verdict(fw.static_filters, job, p, ctx).ok]
    if not static_ok:
        outcome = Outcome.UNSCHEDULABLE if typed else worst
        status = Status(outcome, "; ".join(reasons[:3]) or "no pool")
        if outcome is Outcome.UNSCHEDULABLE and fw.preempt is not None:
            tried = _try_preempt(job, typed, ctx, fw.preempt, out)
            if tried is not None and tried.reason != NO_VICTIMS:  # nothing to preempt: the filters' reason stands
                status = tried
        return status
    usable = [p for p in static_ok if p.name not in blocked_pools]
    # step 3: score
    scorer = fw.score(ctx.policy_of(job))
    ranked = sorted(usable, key=lambda p: (scorer.score(job, p, ctx), p.name))
    # step 4: reserve
    last = Status(Outcome.UNSCHEDULABLE, "blocked behind a starving job" if static_ok and not usable else "no room")
    for strict in (True, False) if job.avoid_nodes else (False,):
        for pool in ranked:
            got = fw.reserve.reserve(job, pool, ctx, strict_avoid=strict)
            if isinstance(got, Placement):
                out.placements.append(got)
                return FITS
            last = got
    # step 5: preempt
    if fw.preempt is not None:
        status = _try_preempt(job, static_ok, ctx, fw.preempt, out)
        if status is not None:
            last = status
    if ctx.now - job.pending_since >= ctx.settings.starvation_s:
        blocked_pools.update(p.name for p in static_ok if not p.kind.is_cloud)
    return last


def _verdict(filters: tuple[Filter, ...], job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
    """The first failing filter's status, else FITS."""
    for f in filters:
        verdict = f.filter(job, pool, ctx)
        if not verdict.ok:
            return verdict
    return FITS


def _try_preempt(job: PendingJob, pools: list[Pool], ctx: PassContext, preempt: Preempt, out: CycleResult) -> Status | None:
    victims, status = preempt.victims(job, pools, ctx)
    for v in victims:
        out.preemptions.append((v, job.job_id))
        ctx.mark_preempting(v)
    return status
