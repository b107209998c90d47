"""One scheduler pass: lease → snapshot → cycle → commit → preempt → release lease.

Contract:
- The pass reads and writes only through :class:`PassStores` (the store ports of
  :mod:`gpufleet.store.snapshot`, :mod:`gpufleet.store.placements` and :mod:`gpufleet.store.lease`;
  :func:`gpufleet.store.scheduling.pass_stores` builds the DynamoDB ones).
- At most one pass runs at a time: the lease is acquired first; a pass that cannot
  get it returns ``skipped=True`` and does nothing. The commit transactions stay safe
  even without the lease (two passes racing cannot overcommit), the lease only avoids
  wasted work.
- Placements are group-committed (``group`` per transaction, falling back to one
  transaction each when a group is cancelled); a lost race leaves that job PENDING
  for the next pass. Preemptions are requested after the placements.
- UNRESOLVABLE and ERROR decisions record a backoff on the job item.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from gpufleet.clock import Clock
from gpufleet.pools import Pool
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.store.lease import Lease
from gpufleet.store.placements import PlacementStore
from gpufleet.store.snapshot import SnapshotReader


@dataclass(frozen=True)
class PassStores:
    """What a pass reads and writes: the snapshot, the placement writes, the one-pass lease."""

    snapshot: SnapshotReader
    placements: PlacementStore
    lease: Lease


@dataclass
class PassReport:
    skipped: bool = False
    pending: int = 0
    placed: int = 0
    lost: int = 0
    preempted: int = 0
    backoffs: int = 0
    snapshot_s: float = 0.0
    cycle_s: float = 0.0
    commit_s: float = 0.0
    lost_reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lost_reasons"] = d["lost_reasons"][:10]
        return d


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
) -> PassReport:
    """Run one pass (see module docstring)."""
    owner = owner or uuid.uuid4().hex
    report = PassReport()
    if use_lease and not stores.lease.acquire(owner, clock.now(), lease_ttl_s):
        report.skipped = True
        return report
    try:
        t0 = time.perf_counter()
        snap = stores.snapshot.load(pools, clock.now())
        report.pending = len(snap.jobs)
        t1 = time.perf_counter()
        result = run_cycle(snap, config, seed=seed)
        t2 = time.perf_counter()
        for res in stores.placements.commit_many(result.placements, snap.quotas, clock.now(), group=group):
            if res.ok:
                report.placed += 1
            else:
                report.lost += 1
                report.lost_reasons.append(f"{res.job_id}: {res.reason}")
        for victim, by in result.preemptions:
            if stores.placements.request_preemption(victim, by, clock.now()):
                report.preempted += 1
        for job_id, rq in result.requeue.items():
            if rq.backoff and rq.delay_s > 0 and result.status[job_id].outcome.value in ("unresolvable", "error"):
                stores.placements.record_backoff(job_id, clock.now() + rq.delay_s, result.status[job_id].reason)
                report.backoffs += 1
        report.snapshot_s, report.cycle_s, report.commit_s = t1 - t0, t2 - t1, time.perf_counter() - t2
        return report
    finally:
        if use_lease:
            stores.lease.release(owner)
