"""One scheduler pass against DynamoDB: lease → snapshot → cycle → commit → preempt → release lease.

Contract:
- At most one pass runs at a time: :func:`acquire_lease` is a conditional put on
  ``LEASE#scheduler``/``LEASE`` (control table) that succeeds only if no unexpired
  lease exists; a pass that cannot get it returns ``skipped=True`` and does nothing.
  The commit transactions stay safe even without the lease (two passes racing
  cannot overcommit), the lease only avoids wasted work.
- Placements are group-committed (``group`` per transaction, falling back to one
  transaction each when a group is cancelled); a lost race leaves that job PENDING
  for the next pass. Preemptions are requested after the placements.
- UNRESOLVABLE and ERROR decisions record a backoff on the job item.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock
from gpufleet.pools import Pool, load_pools
from gpufleet.scheduler import store
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.store.dynamo import error_code, marshal
from gpufleet.tables import TableNames

LEASE_KEY = {"pk": "LEASE#scheduler", "sk": "LEASE"}


def acquire_lease(client, table: str, owner: str, now: float, ttl_s: float) -> bool:
    try:
        client.put_item(
            TableName=table,
            Item=marshal({**LEASE_KEY, "owner": owner, "expires_at": int(now + ttl_s), "lease_until": now + ttl_s}),
            ConditionExpression="attribute_not_exists(pk) OR lease_until < :now",
            ExpressionAttributeValues={":now": {"N": repr(float(now))}},
        )
        return True
    except ClientError as err:
        if error_code(err) == "ConditionalCheckFailedException":
            return False
        raise


def release_lease(client, table: str, owner: str) -> None:
    try:
        client.delete_item(
            TableName=table,
            Key=marshal(LEASE_KEY),
            ConditionExpression="#o = :o",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":o": {"S": owner}},
        )
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            raise


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
    ddb,
    names: TableNames | None = None,
    *,
    sfn=None,
    pools: tuple[Pool, ...] | None = None,
    clock: Clock | None = None,
    config: SchedulerConfig | None = None,
    seed: int = 0,
    use_lease: bool = True,
    lease_ttl_s: float = 300.0,
    owner: str | None = None,
    group: int = 20,
) -> PassReport:
    """Run one pass (see module docstring)."""
    names = names or TableNames.from_env()
    clock = clock or SystemClock()
    pools = pools if pools is not None else load_pools()
    owner = owner or uuid.uuid4().hex
    report = PassReport()
    if use_lease and not acquire_lease(ddb, names.control, owner, clock.now(), lease_ttl_s):
        report.skipped = True
        return report
    try:
        t0 = time.perf_counter()
        snap = store.load_snapshot(ddb, names, pools, clock.now())
        report.pending = len(snap.jobs)
        t1 = time.perf_counter()
        result = run_cycle(snap, config, seed=seed)
        t2 = time.perf_counter()
        for res in store.commit_many(ddb, names, result.placements, snap.quotas, clock.now(), sfn=sfn, group=group):
            if res.ok:
                report.placed += 1
            else:
                report.lost += 1
                report.lost_reasons.append(f"{res.job_id}: {res.reason}")
        for victim, by in result.preemptions:
            if store.request_preemption(ddb, names, victim, by, clock.now()):
                report.preempted += 1
        for job_id, rq in result.requeue.items():
            if rq.backoff and rq.delay_s > 0 and result.status[job_id].outcome.value in ("unresolvable", "error"):
                store.record_backoff(ddb, names, job_id, clock.now() + rq.delay_s, result.status[job_id].reason)
                report.backoffs += 1
        report.snapshot_s, report.cycle_s, report.commit_s = t1 - t0, t2 - t1, time.perf_counter() - t2
        return report
    finally:
        if use_lease:
            release_lease(ddb, names.control, owner)
