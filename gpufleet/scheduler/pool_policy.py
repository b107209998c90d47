"""Steps 2–3 (filter, score) at pool level: which pools a job may use, and which it prefers.

Scope (narrows the pools every later step sees):
- ``allowlist`` (always on): only the pools of the job's allowlist (``PendingJob.pools``;
  empty = all); an allowlist naming no configured pool is UNRESOLVABLE.

Filters (hard):
- ``gpu-type``: the pool's GPU type is the requested one (or the job takes any);
- ``residency``: with a residency list, the pool's region/site must be in it;
- ``fits-ever``: some node of the pool (or the cloud pool's size) could hold one member
  when empty — failing this everywhere makes the job UNRESOLVABLE; a gang (``nodes`` > 1)
  never fits a cloud pool: a Batch attempt is one container on one instance (multi-node
  parallel jobs are not built), so placing it there would book and bill every member and
  run one;
- ``quota``: charging the job at this pool's GPU type keeps every quota level within its limit;
- ``burst-within-guarantee`` (optional): paid cloud pools only for work within its owner's
  guarantee;
- ``burst-after-wait`` (optional): paid cloud pools only once the job has waited ``burst_after_s``.
The ``static_filters`` of the configuration (default: ``gpu-type``, ``residency``, ``fits-ever``)
decide which pools the job could use if quota and capacity allowed.

Scores (a cost, lower is better):
- ``cost``: on-prem first, then spot, then on-demand; price × GPUs × expected hours
  + egress per GB for inputs that must move to a cloud pool;
- ``latency``: expected start — a free on-prem node ≈ 0, a cloud pool its cold start
  grown by the queue this pass already sent there;
- ``locality``: where the inputs and cached model weights already are (fraction
  missing), then cost.
"""

from __future__ import annotations

from gpufleet.pools import KIND_ORDER, Pool, PoolKind
from gpufleet.scheduler.context import PassContext
from gpufleet.scheduler.model import ALL_TYPES, ANY, PendingJob, allowed_pools
from gpufleet.scheduler.results import FITS, Outcome, Status


class AllowlistScope:
    def narrow(self, job: PendingJob, pools: list[Pool], ctx: PassContext) -> list[Pool] | Status:
        candidates = allowed_pools(job, pools)
        if candidates:
            return candidates
        known = ", ".join(p.name for p in ctx.snapshot.pools)
        return Status(Outcome.UNRESOLVABLE, f"none of the job's pools ({', '.join(job.pools)}) exists; pools: {known}")


class GpuTypeFilter:
    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        if job.gpu_type in (ANY, pool.gpu_type) or job.num_gpu == 0:
            return FITS
        return Status(Outcome.UNRESOLVABLE, f"pool {pool.name} has {pool.gpu_type}, job wants {job.gpu_type}")


class ResidencyFilter:
    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        if not job.residency or pool.region in job.residency:
            return FITS
        return Status(Outcome.UNRESOLVABLE, f"pool {pool.name} ({pool.region}) is outside residency {list(job.residency)}")


class FitsEverFilter:
    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        if pool.kind.is_cloud:
            if not job.image_pinned:
                return Status(Outcome.UNRESOLVABLE, f"pool {pool.name} runs container images by digest only "
                                                    "(repository@sha256:...): a tag-only image runs on-prem")
            if job.nodes > 1 and not pool.gangs:
                return Status(Outcome.UNRESOLVABLE, f"pool {pool.name} runs single-node jobs only: a {job.nodes}-node "
                                                    "gang needs on-prem nodes or a pool with gangs (Batch multi-node "
                                                    "parallel jobs)")
            if ctx.charge_milli(job, pool) <= pool.max_gpus * 1000:
                return FITS
            return Status(Outcome.UNRESOLVABLE, f"pool {pool.name} is smaller than the job")
        if ctx.pool_max_member_fit(pool.name, job) >= job.nodes:
            return FITS
        return Status(Outcome.UNRESOLVABLE, f"no {job.nodes} node(s) of pool {pool.name} could ever hold the job")


class QuotaFilter:
    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        bad = ctx.ledger.violation(job.owner_path, pool.gpu_type, ctx.charge_milli(job, pool))
        if bad is None:
            return FITS
        return Status(Outcome.UNSCHEDULABLE, f"quota of {bad} for {pool.gpu_type} would be exceeded")


class BurstWithinGuaranteeFilter:
    """Paid cloud pools only for work within its owner's guarantee; borrowed work waits on-prem."""

    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        if not pool.kind.is_cloud:
            return FITS
        if ctx.ledger.within_guarantee(job.owner_path, ALL_TYPES, ctx.charge_milli(job, pool)):
            return FITS
        return Status(Outcome.UNSCHEDULABLE, f"{job.owner_path} is beyond its guarantee: no paid burst to {pool.name}")


class BurstAfterWaitFilter:
    """Paid cloud pools only for jobs that have waited ``burst_after_s``: short waits are absorbed on-prem."""

    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status:
        if not pool.kind.is_cloud or ctx.now - job.pending_since >= ctx.settings.burst_after_s:
            return FITS
        return Status(Outcome.UNSCHEDULABLE, f"waits {ctx.settings.burst_after_s:.0f} s for on-prem before bursting to {pool.name}")


def _cost(job: PendingJob, pool: Pool, ctx: PassContext) -> float:
    gpus = ctx.charge_milli(job, pool) / 1000.0
    money = pool.price_per_gpu_hour * gpus * ctx.settings.expected_runtime_h
    if pool.kind.is_cloud:
        money += pool.egress_per_gb * job.input_gb
    return KIND_ORDER[pool.kind] * 1e6 + money


class CostScore:
    def score(self, job: PendingJob, pool: Pool, ctx: PassContext) -> float:
        return _cost(job, pool, ctx)


class LatencyScore:
    def score(self, job: PendingJob, pool: Pool, ctx: PassContext) -> float:
        if pool.kind is PoolKind.ONPREM:
            start = pool.cold_start_s if ctx.pool_has_room(pool.name, job) else 1e6
        else:
            depth = ctx.placed_to[pool.name]
            start = pool.cold_start_s * (1.0 + depth / max(1, pool.max_gpus))
        return start + _cost(job, pool, ctx) * 1e-9


class LocalityScore:
    def score(self, job: PendingJob, pool: Pool, ctx: PassContext) -> float:
        wanted = set(job.inputs) | ({job.model} if job.model else set())
        missing = 1.0
        if wanted and pool.kind is PoolKind.ONPREM:
            have = ctx.pool_data(pool.name)
            missing = 1.0 - len(wanted & have) / len(wanted)
        return missing * 1e9 + _cost(job, pool, ctx)
