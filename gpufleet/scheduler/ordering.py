"""Step 1 (order): queue sorts.

- ``fifo``: oldest first.
- ``priority``: higher priority first, then oldest.
- ``drf``: weighted DRF — the team with the lowest weighted dominant share first
  (then priority, then age). A team's share is recomputed as the pass places jobs.
- ``drf-aging`` (default): effective priority = priority + ``aging_per_minute`` ×
  minutes waiting, in steps of 10 points (so nothing starves, and within a step the
  weighted dominant share decides), then weighted dominant share, then age.
Sorts are pure functions of the jobs and the pass context; the registry
(:mod:`gpufleet.scheduler.registry`) names them.
"""

from __future__ import annotations

from gpufleet.scheduler.context import PassContext
from gpufleet.scheduler.model import PendingJob


def team_path(job: PendingJob) -> str:
    return f"{job.tenant}/{job.team}"


class Fifo:
    def sort(self, jobs: list[PendingJob], ctx: PassContext) -> list[PendingJob]:
        return sorted(jobs, key=lambda j: (j.created_at, j.job_id))


class PriorityFifo:
    def sort(self, jobs: list[PendingJob], ctx: PassContext) -> list[PendingJob]:
        return sorted(jobs, key=lambda j: (-j.priority, j.created_at, j.job_id))


#: aging raises priority in steps of this many points, so that within a step DRF decides
AGING_QUANTUM = 10


def effective_priority(job: PendingJob, now: float, aging_per_minute: float) -> float:
    """Priority plus ``aging_per_minute`` points per minute waited, in steps of :data:`AGING_QUANTUM`."""
    gained = aging_per_minute * max(0.0, now - job.pending_since) / 60.0
    return job.priority + AGING_QUANTUM * (gained // AGING_QUANTUM)


class Drf:
    aging = False

    def sort(self, jobs: list[PendingJob], ctx: PassContext) -> list[PendingJob]:
        cap = ctx.capacity_by_type
        share: dict[str, float] = {}
        for j in jobs:
            t = team_path(j)
            if t not in share:
                share[t] = ctx.ledger.dominant_share(t, cap)
        rate = ctx.settings.aging_per_minute if self.aging else 0.0
        now = ctx.now
        if self.aging:
            return sorted(jobs, key=lambda j: (-effective_priority(j, now, rate), share[team_path(j)], j.created_at, j.job_id))
        return sorted(jobs, key=lambda j: (share[team_path(j)], -j.priority, j.created_at, j.job_id))


class DrfAging(Drf):
    aging = True
