"""The fixed result vocabulary of a scheduling decision and what the framework does with it.

- ``FITS``: placed; nothing to retry.
- ``UNSCHEDULABLE``: could fit but not now (capacity, quota, waiting on preemption):
  requeue for the next pass, no backoff.
- ``UNRESOLVABLE``: can never fit as the cluster is configured (no pool with the GPU
  type, residency excludes every pool, larger than any node): back off
  exponentially so it is retried rarely; a change of the cluster's static shape
  (:mod:`gpufleet.scheduler.shape`: a node registered, a pool configured) makes it
  eligible again before its backoff ends.
- ``ERROR``: a plugin failed unexpectedly: back off with full jitter.
Backoff is a pure function of the job's *scheduling* attempt count (``PendingJob.sched_attempts``:
the UNRESOLVABLE/ERROR decisions already recorded on it, 0 at the first; not its run attempts) and
a random draw in [0, 1): ``base_s * 2**n`` capped at ``cap_s`` (30 s, 60 s, 120 s, ... 1 h).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: the preemption reason when no running job could make room (a filter's own reason, e.g. a quota, stands then)
NO_VICTIMS = "no capacity and no eligible victims"


class Outcome(StrEnum):
    FITS = "fits"
    UNSCHEDULABLE = "unschedulable"
    UNRESOLVABLE = "unresolvable"
    ERROR = "error"


@dataclass(frozen=True)
class Status:
    outcome: Outcome
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.FITS


FITS = Status(Outcome.FITS)


@dataclass(frozen=True)
class Requeue:
    """What happens to a job after a pass: retry after ``delay_s`` (0 = next pass)."""

    delay_s: float
    backoff: bool


def requeue_for(status: Status, attempts: int, draw: float, *, base_s: float = 30.0, cap_s: float = 3600.0) -> Requeue | None:
    """Map a decision to retry behaviour (``None`` for FITS)."""
    if status.outcome is Outcome.FITS:
        return None
    if status.outcome is Outcome.UNSCHEDULABLE:
        return Requeue(0.0, backoff=False)
    ceiling = min(cap_s, base_s * (2 ** min(attempts, 20)))
    if status.outcome is Outcome.UNRESOLVABLE:
        return Requeue(ceiling, backoff=True)
    return Requeue(max(1.0, ceiling * draw), backoff=True)  # ERROR: full jitter
