"""Queue positions and estimated starts of PENDING jobs, from one scheduler pass (pure).

Contract: :func:`build` turns a pass's outcome into a :class:`QueueView`: every job the pass left
PENDING gets a 1-based ``position`` — first the jobs the pass considered, in its queue order (step 1
of :mod:`gpufleet.scheduler.cycle`), then the jobs that were backing off, by when their backoff ends
— and an ``estimated_start``: ``now + ceil(position / placed) * pass_interval_s`` when the pass placed
``placed`` > 0 jobs (the last pass's placement rate), never earlier than a job's backoff end; ``None``
when the pass placed nothing (no rate to go by). It is an estimate from the last pass only, not a
promise (docs/scheduler.md). At most ``limit`` jobs are kept (the front of the queue).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.scheduler.model import PendingJob

#: jobs a view keeps (the item stays far below DynamoDB's 400 KB)
LIMIT = 2000


@dataclass(frozen=True)
class QueueView:
    at: float
    pending: int
    placed: int
    pass_interval_s: float
    #: job id → (position, estimated start or None)
    jobs: dict[str, tuple[int, float | None]] = field(default_factory=dict)

    def of(self, job_id: str) -> dict | None:
        """The view of one job for the API (``None`` when the pass did not see it)."""
        got = self.jobs.get(job_id)
        if got is None:
            return None
        return {"position": got[0], "pending": self.pending, "estimated_start": got[1], "as_of": self.at}


def build(jobs: Iterable[PendingJob], order: list[str], placed: set[str], now: float, *,
          pass_interval_s: float, limit: int = LIMIT) -> QueueView:
    """The view after a pass (module contract)."""
    by_id = {j.job_id: j for j in jobs}
    considered = [jid for jid in order if jid not in placed and jid in by_id]
    seen = set(considered) | placed
    backing_off = sorted((j for jid, j in by_id.items() if jid not in seen), key=lambda j: (j.backoff_until, j.job_id))
    rate = len(placed)
    out: dict[str, tuple[int, float | None]] = {}
    for pos, jid in enumerate([*considered, *(j.job_id for j in backing_off)][:limit], start=1):
        est = now + math.ceil(pos / rate) * pass_interval_s if rate else None
        backoff = by_id[jid].backoff_until
        if est is not None and backoff > est:
            est = backoff
        out[jid] = (pos, est)
    return QueueView(at=now, pending=len(considered) + len(backing_off), placed=rate,
                     pass_interval_s=pass_interval_s, jobs=out)
