"""The scheduler's writes: the placement transaction, release, preemption requests, backoffs.

Items (keys from :mod:`gpufleet.tables`): the job item (PENDING→SCHEDULED) and its ``ATTEMPT#<epoch>``
and status event items (jobs table); on the control table ``ALLOC#<node>``/``BOOK`` (``g<i>`` =
milli booked on GPU i), ``ALLOC#<pool>``/``POOL`` (``used_milli`` of a cloud pool),
``ALLOC#<node|pool>``/``<job_id>#<epoch:08d>`` (one allocation record per gang member,
``gsi1pk=OWNER#<owner path>``) and the quota nodes' usage counters (:mod:`gpufleet.store.quotas`).

:func:`commit` writes one placement in ONE ``TransactWriteItems``: the job moves
PENDING→SCHEDULED with a new fencing epoch (``current_epoch`` must still be the
epoch the snapshot saw — :func:`gpufleet.store.fencing.issue_epoch` semantics), the
attempt item is created, every GPU booking is raised only if it stays <= 1000 milli,
cloud pool usage only if it stays <= ``max_gpus``, and every quota level's usage only
if it stays within that level's limit. Two passes racing over the same snapshot
cannot both win: the loser's transaction is cancelled and its job stays PENDING.
Only then is the job's placement token completed with the placement JSON.
:func:`commit_many` groups placements into fewer transactions with the same guarantees.

:func:`release` undoes an attempt's bookings, allocation records and quota usage,
once (the attempt item records ``released_at`` conditionally).

:class:`PlacementStore` is the scheduler pass's view of these writes; AWS errors become
:mod:`gpufleet.errors` exceptions (a lost race is a :class:`CommitResult` with ``ok=False``).

In-memory fake: :class:`gpufleet.store.fakes.placements.MemoryPlacementStore`; both are held to one contract
suite (``tests/functional/store/test_store_contract_placements.py``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock, iso
from gpufleet.errors import Conflict, NotFound, TransientError
from gpufleet.pools import Pool
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import ALL_TYPES, Allocation, QuotaNode, ancestors
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.status import AttemptState, JobStatus
from gpufleet.store.dynamo import (
    cancellation_reasons,
    conditional_write,
    error_code,
    marshal,
    marshal_value,
    translate_errors,
    unmarshal,
)
from gpufleet.store.escrow import Amounts, escrow_update, retry_conflicts
from gpufleet.store.escrow import give_back as escrow_give_back
from gpufleet.store.escrow import read as escrow_read
from gpufleet.store.escrow import reserve as escrow_reserve
from gpufleet.store.fencing import epoch_condition
from gpufleet.store.jobs import build_event, transition_update
from gpufleet.store.quotas import usage_attr
from gpufleet.tables import (
    BOOK_SK,
    DIR_ALLOCATIONS,
    DIRECTORY_ATTR,
    JOB_META,
    POOL_SK,
    QUOTA_SK,
    TableNames,
    alloc_pk,
    alloc_sk,
    attempt_sk,
    directory_of,
    job_pk,
    owner_pk,
    quota_pk,
)

#: what a placement removes from the job item: its scheduling attempts and the cluster shape its last backoff saw
PLACEMENT_RESETS = ("sched_attempts", "sched_shape")
#: what a commit sets on the job item besides its status move (PENDING -> SCHEDULED, :func:`_parts`): the new epoch,
#: the placement, the attempt count and when (:data:`PLACEMENT_RESETS` are removed)
PLACED_ATTRIBUTES = ("current_epoch", "placement", "attempt_count", "scheduled_at")
#: what :func:`release` writes on the attempt item
RELEASE_ATTRIBUTES = ("pk", "sk", "released_at")
#: what :func:`request_preemption` writes on the victim's job item, fenced on its epoch
PREEMPT_ATTRIBUTES = ("pk", "sk", "current_epoch", "preempt_requested", "last_preempted_at")
#: what :func:`record_backoff` and :func:`record_reason` write on a still-PENDING job (conditioned on its status)
BACKOFF_ATTRIBUTES = ("pk", "sk", "status", "sched_backoff_until", "sched_reason", "sched_shape", "sched_attempts")
#: most items one placement may touch (DynamoDB allows 100 per transaction)
MAX_TRANSACTION_ITEMS = 100


@dataclass(frozen=True)
class CommitResult:
    job_id: str
    ok: bool
    #: the attempt's epoch when the placement transaction landed (0 when it did not)
    epoch: int = 0
    reason: str = ""

    @property
    def landed(self) -> bool:
        """The transaction landed (its quota was charged), even if the placement was then given back (``ok`` False:
        the workflow no longer waited, and the attempt was released)."""
        return self.ok or self.epoch > 0


def _upd(table: str, key: dict[str, Any], expr: str, names: dict[str, str], values: dict[str, Any], cond: str | None = None) -> dict[str, Any]:
    """One transaction update; a counter of the control table's directory (BOOK, POOL, QUOTA: an update
    may create it) also sets its ``gsi2pk`` so the scheduler's snapshot lists it."""
    listed = directory_of(key["pk"], key["sk"])
    if listed is not None:
        values = {**values, ":dir": {"S": listed}}
        expr = f"SET {DIRECTORY_ATTR} = :dir, {expr[4:]}" if expr.startswith("SET ") else f"SET {DIRECTORY_ATTR} = :dir {expr}"
    u: dict[str, Any] = {
        "TableName": table,
        "Key": marshal(key),
        "UpdateExpression": expr,
        "ExpressionAttributeValues": values,
    }
    if names:
        u["ExpressionAttributeNames"] = names
    if cond:
        u["ConditionExpression"] = cond
    return {"Update": u}


def _put_new(table: str, item: dict[str, Any]) -> dict[str, Any]:
    return {"Put": {"TableName": table, "Item": marshal(item), "ConditionExpression": "attribute_not_exists(pk)"}}


@dataclass
class _Parts:
    """One placement's share of a commit: its own items and its deltas on shared counters."""

    placement: Placement
    epoch: int
    doc: dict[str, Any]
    own: list[dict[str, Any]]  # job update, attempt put, allocation records
    books: dict[str, dict[int, int]]  # node -> GPU index -> milli
    pool: tuple[str, int] | None  # cloud pool, milli
    quota: list[tuple[str, str, int]]  # (path, gpu type, milli)


def _parts(names: TableNames, p: Placement, now: float) -> _Parts:
    job = p.job
    epoch = job.observed_epoch + 1
    doc = p.to_json(epoch)
    upd = transition_update(
        names.jobs,
        job.job_id,
        [JobStatus.PENDING],
        JobStatus.SCHEDULED,
        now,
        extra={"current_epoch": epoch, "placement": doc, "attempt_count": job.attempts + 1, "scheduled_at": iso(now)},
        # a placed job's next wait (a retry, a preemption) backs off from the start again; its wait reason stays for
        # the diagnosis of this attempt's wait (gpufleet.store.diagnosis)
        remove=PLACEMENT_RESETS,
        # fencing: the epoch must still be the one the snapshot saw (issue_epoch semantics)
        epoch=job.observed_epoch,
    )["Update"]
    upd.pop("ReturnValuesOnConditionCheckFailure", None)
    per_gpu = job.gpu_milli if job.num_gpu else 0
    cloud = p.pool.kind.is_cloud
    charge = {
        "owner_path": job.owner_path,
        "priority": job.priority,
        "pool": p.pool.name,
        "gpu_type": p.gpu_type,
        "charge_milli": p.charge_milli,
        "gpu_milli": MILLI if cloud else per_gpu,
        "num_gpu": job.num_gpu,
        "cpu_milli": job.cpu_milli,
        "memory_mib": job.memory_mib,
        "members": [{"node": m.node, "gpu_indices": list(m.gpu_indices), "queue_url": m.queue_url} for m in p.members],
    }
    attempt = {
        "pk": job_pk(job.job_id),
        "sk": attempt_sk(epoch),
        "type": "attempt",
        "job_id": job.job_id,
        "epoch": epoch,
        "state": AttemptState.PLACED.value,
        "placement": doc,
        "charge": charge,
        "created_at": iso(now),
    }
    own: list[dict[str, Any]] = [
        {"Update": upd},
        _put_new(names.jobs, attempt),
        # the timeline shows the placement, written in the same transaction as the move itself
        _put_new(names.jobs, build_event(job.job_id, "status", now, {
            "from": [JobStatus.PENDING.value], "to": JobStatus.SCHEDULED.value, "epoch": epoch,
            "pool": p.pool.name, "nodes": [m.node for m in p.members],
            # the chosen GPUs' worst link per member (gpufleet.topology), when any member has several GPUs
            **({"gpu_link": [m.gpu_link for m in p.members]} if any(m.gpu_link for m in p.members) else {})})),
    ]
    record = {
        "job_id": job.job_id,
        "epoch": epoch,
        "owner_path": job.owner_path,
        "gsi1pk": owner_pk(job.owner_path),
        DIRECTORY_ATTR: DIR_ALLOCATIONS,
        "priority": job.priority,
        "pool": p.pool.name,
        "gpu_type": p.gpu_type,
        "gpu_milli": charge["gpu_milli"],
        "num_gpu": job.num_gpu,
        "cpu_milli": job.cpu_milli,
        "memory_mib": job.memory_mib,
        "started_at": now,
        "last_preempted_at": job.last_preempted_at,
    }
    books: dict[str, dict[int, int]] = {}
    if cloud:
        own.append(_put_new(names.control, {"pk": alloc_pk(p.pool.name), "sk": alloc_sk(job.job_id, epoch), **record}))
    else:
        for m in p.members:
            books[m.node] = {g: per_gpu for g in m.gpu_indices}
            own.append(_put_new(names.control, {
                "pk": alloc_pk(m.node), "sk": alloc_sk(job.job_id, epoch), **record,
                "node": m.node, "gpu_indices": list(m.gpu_indices), "queue_url": m.queue_url}))
    quota = [(path, p.gpu_type, p.charge_milli) for path in ancestors(job.owner_path)]
    return _Parts(p, epoch, doc, own, books, (p.pool.name, p.charge_milli) if cloud else None, quota)


@dataclass(frozen=True)
class _Totals:
    """What a group of placements adds up to: milli per GPU per node, per cloud pool, per quota path and type."""

    books: dict[str, dict[int, int]]
    pool_use: dict[str, int]
    quota: dict[str, dict[str, int]]


def _totals(parts: list[_Parts]) -> _Totals:
    books: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    pool_use: dict[str, int] = defaultdict(int)
    quota: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pt in parts:
        for node, gs in pt.books.items():
            for g, m in gs.items():
                books[node][g] += m
        if pt.pool:
            pool_use[pt.pool[0]] += pt.pool[1]
        for path, t, m in pt.quota:
            quota[path][t] += m
            quota[path][ALL_TYPES] += m
    return _Totals(books, pool_use, quota)


def _shared_items(names: TableNames, parts: list[_Parts], quotas: dict[str, QuotaNode], pools: dict[str, Pool],
                  lane: str | None = None) -> list[dict[str, Any]]:
    """Aggregated, conditioned updates of GPU bookings, cloud pool usage and quota usage (with a ``lane``: drawn
    from the lane's quota escrow, :mod:`gpufleet.store.escrow`, instead of the quota items)."""
    items: list[dict[str, Any]] = []
    totals = _totals(parts)
    books, pool_use, quota = totals.books, totals.pool_use, totals.quota
    for node, gs in books.items():
        nm = {f"#g{g}": f"g{g}" for g in gs}
        vals: dict[str, Any] = {":zero": {"N": "0"}}
        sets, conds = [], []
        for g, m in gs.items():
            if m > MILLI:
                raise Conflict(f"GPU {g} of {node} would be booked {m} milli")
            vals[f":m{g}"] = {"N": str(m)}
            vals[f":c{g}"] = {"N": str(MILLI - m)}
            sets.append(f"#g{g} = if_not_exists(#g{g}, :zero) + :m{g}")
            conds.append(f"(attribute_not_exists(#g{g}) OR #g{g} <= :c{g})")
        if sets:
            items.append(_upd(names.control, {"pk": alloc_pk(node), "sk": BOOK_SK}, "SET " + ", ".join(sets), nm, vals, " AND ".join(conds)))
    for pool, m in pool_use.items():
        cap = pools[pool].max_gpus * MILLI - m
        if cap < 0:
            raise Conflict(f"pool {pool} is smaller than {m} milli")
        items.append(
            _upd(names.control, {"pk": alloc_pk(pool), "sk": POOL_SK}, "ADD used_milli :n", {}, {":n": {"N": str(m)}, ":cap": {"N": str(cap)}}, "attribute_not_exists(used_milli) OR used_milli <= :cap")
        )
    if lane is not None:
        if quota:
            items.append(escrow_update(names, lane, {p: dict(pt) for p, pt in quota.items()}, sign=-1, checked=True))
        return items
    for path, per_type in quota.items():
        q = quotas.get(path)
        nm, vals, adds, conds = {}, {}, [], []
        for i, (t, m) in enumerate(sorted(per_type.items())):
            nm[f"#u{i}"] = usage_attr(t)
            vals[f":n{i}"] = {"N": str(m)}
            adds.append(f"#u{i} :n{i}")
            lim = q.limit(t) if q is not None else None
            if lim is not None:
                if lim < m:
                    raise Conflict(f"{m} milli of {t} exceeds the limit of {path} ({lim})")
                vals[f":c{i}"] = {"N": str(lim - m)}
                conds.append(f"(attribute_not_exists(#u{i}) OR #u{i} <= :c{i})")
        items.append(_upd(names.control, {"pk": quota_pk(path), "sk": QUOTA_SK}, "ADD " + ", ".join(adds), nm, vals, " AND ".join(conds) or None))
    return items


def placement_items(names: TableNames, p: Placement, quotas: dict[str, QuotaNode], now: float,
                    lane: str | None = None) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """The single-placement transaction for ``p`` → (items, new epoch, placement JSON)."""
    pt = _parts(names, p, now)
    items = pt.own + _shared_items(names, [pt], quotas, {p.pool.name: p.pool}, lane)
    if len(items) > MAX_TRANSACTION_ITEMS:
        raise Conflict(f"placement of {p.job.job_id} needs {len(items)} transaction items (max {MAX_TRANSACTION_ITEMS})")
    return items, pt.epoch, pt.doc


def _transact(client, items: list[dict[str, Any]]) -> str | None:
    """Run a transaction; None on success, else the reason it was cancelled. A cancellation only by
    ``TransactionConflict`` (another transaction on one of its items at that moment) is tried again as is
    (:func:`gpufleet.store.escrow.retry_conflicts`); a failed condition is not: the job is decided again."""
    try:
        retry_conflicts(lambda: client.transact_write_items(TransactItems=items))
        return None
    except ClientError as err:
        code = error_code(err)
        if code == "TransactionCanceledException":
            return f"lost: {cancellation_reasons(err)}"
        if code in ("TransactionConflictException", "ThrottlingException", "ProvisionedThroughputExceededException"):
            return code
        raise TransientError(f"commit: {code}") from err


def _complete(client, names: TableNames, pt: _Parts, sfn) -> CommitResult:
    job = pt.placement.job
    if sfn is not None and job.placement_token:
        try:
            sfn.send_task_success(taskToken=job.placement_token, output=json.dumps(pt.doc))
        except ClientError as err:
            # The workflow no longer waits (timed out / cancelled): give the capacity back now — its
            # ClassifyFailure never saw this placement, so nothing else would.
            reason = f"token: {error_code(err)}"
            try:
                release(client, job.job_id, pt.epoch, names=names, clock=SystemClock())
            except (TransientError, NotFound) as gone:
                reason += f"; release failed: {gone}"
            return CommitResult(job.job_id, False, pt.epoch, reason=reason)
    return CommitResult(job.job_id, True, pt.epoch)


def commit(client, names: TableNames, p: Placement, quotas: dict[str, QuotaNode], now: float, *, sfn=None,
           lane: str | None = None) -> CommitResult:
    """Commit one placement atomically, then complete the job's placement token (see module docstring); with a
    ``lane``, its quota is drawn from that lane's escrow."""
    try:
        items, _, _ = placement_items(names, p, quotas, now, lane)
    except Conflict as err:
        return CommitResult(p.job.job_id, False, reason=str(err))
    reason = _transact(client, items)
    if reason is not None:
        return CommitResult(p.job.job_id, False, reason=reason)
    return _complete(client, names, _parts(names, p, now), sfn)


def commit_many(client, names: TableNames, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *,
                sfn=None, group: int = 20, lane: str | None = None) -> list[CommitResult]:
    """Group commit: up to ``group`` placements per transaction (shared counters aggregated,
    each condition on the group's total). A cancelled group falls back to one transaction
    per placement, so one lost race costs only that job. Tokens are completed after the
    transaction that placed the job. With a ``lane``, quota is drawn from the lane's escrow (reserved before,
    :mod:`gpufleet.store.escrow`) instead of the quota items."""
    results: list[CommitResult] = []
    pools = {p.pool.name: p.pool for p in placements}

    def flush(batch: list[_Parts]) -> None:
        if not batch:
            return
        try:
            items = [it for pt in batch for it in pt.own] + _shared_items(names, batch, quotas, pools, lane)
            reason = _transact(client, items) if len(items) <= MAX_TRANSACTION_ITEMS else "too large"
        except Conflict as err:
            reason = str(err)
        if reason is None:
            results.extend(_complete(client, names, pt, sfn) for pt in batch)
        elif len(batch) == 1:
            results.append(commit(client, names, batch[0].placement, quotas, now, sfn=sfn, lane=lane))
        else:
            for pt in batch:
                results.append(commit(client, names, pt.placement, quotas, now, sfn=sfn, lane=lane))

    for batch in commit_groups([_parts(names, p, now) for p in placements], group, lane):
        flush(batch)
    return results


def shared_counters(batch: list[_Parts], lane: str | None = None) -> set[tuple[str, str]]:
    """The distinct counter items a group touches (bookings, pools, quota levels — or the lane's one escrow item):
    one transaction item each."""
    keys: set[tuple[str, str]] = set()
    for pt in batch:
        keys.update(("book", n) for n in pt.books)
        if pt.pool:
            keys.add(("pool", pt.pool[0]))
        if lane is None:
            keys.update(("quota", path) for path, _, _ in pt.quota)
        elif pt.quota:
            keys.add(("escrow", lane))
    return keys


def commit_groups(parts: list[_Parts], group: int, lane: str | None = None) -> list[list[_Parts]]:
    """``parts`` in order, cut into groups of at most ``group`` placements whose transaction — every placement's
    own items plus each shared counter once — stays within :data:`MAX_TRANSACTION_ITEMS`. Placements that share
    counters (a team's quota levels, a node's bookings) pack densely; a placement too large on its own is a group
    of its own (its commit reports it)."""
    groups: list[list[_Parts]] = []
    batch: list[_Parts] = []
    own, shared = 0, set()
    for pt in parts:
        keys = shared_counters([pt], lane)
        if batch and (len(batch) >= group or own + len(pt.own) + len(shared | keys) > MAX_TRANSACTION_ITEMS):
            groups.append(batch)
            batch, own, shared = [], 0, set()
        batch.append(pt)
        own += len(pt.own)
        shared |= keys
    if batch:
        groups.append(batch)
    return groups


# ------------------------------------------------------------------ release


def release(client, job_id: str, epoch: int, *, names: TableNames, clock: Clock) -> bool:
    """Give back the capacity and quota of attempt ``epoch`` of ``job_id``. Idempotent.

    Returns True when this call released it, False when it was already released.
    Raises :class:`NotFound` when the attempt does not exist, :class:`TransientError` when
    the release transaction was cancelled for another reason (retry it).
    """
    with translate_errors():
        got = client.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}), ConsistentRead=True)
    att = unmarshal(got.get("Item"))
    if att is None:
        raise NotFound(f"attempt {epoch} of {job_id} not found")
    if att.get("released_at") is not None:
        return False
    ch = att.get("charge") or {}
    stamp = iso(clock.now())
    items: list[dict[str, Any]] = [
        _upd(
            names.jobs,
            {"pk": job_pk(job_id), "sk": attempt_sk(epoch)},
            "SET released_at = :t",
            {},
            {":t": {"S": stamp}},
            "attribute_exists(pk) AND attribute_not_exists(released_at)",
        )
    ]
    pool = ch.get("pool", "")
    members = ch.get("members") or []
    if members and members[0].get("node") is None:
        items.append(_upd(names.control, {"pk": alloc_pk(pool), "sk": POOL_SK}, "ADD used_milli :n", {}, {":n": {"N": str(-int(ch.get("charge_milli", 0)))}}))
        items.append({"Delete": {"TableName": names.control, "Key": marshal({"pk": alloc_pk(pool), "sk": alloc_sk(job_id, epoch)})}})
    else:
        per_gpu = int(ch.get("gpu_milli", MILLI))
        for m in members:
            gs = [int(g) for g in m.get("gpu_indices") or []]
            if gs:
                nm = {f"#g{g}": f"g{g}" for g in gs}
                vals = {f":m{g}": {"N": str(-per_gpu)} for g in gs}
                items.append(_upd(names.control, {"pk": alloc_pk(m["node"]), "sk": BOOK_SK}, "ADD " + ", ".join(f"#g{g} :m{g}" for g in gs), nm, vals))
            items.append({"Delete": {"TableName": names.control, "Key": marshal({"pk": alloc_pk(m["node"]), "sk": alloc_sk(job_id, epoch)})}})
    if ch:
        for path in ancestors(ch["owner_path"]):
            items.append(
                _upd(
                    names.control,
                    {"pk": quota_pk(path), "sk": QUOTA_SK},
                    "ADD #t :n, #a :n",
                    {"#t": usage_attr(ch["gpu_type"]), "#a": usage_attr(ALL_TYPES)},
                    {":n": {"N": str(-int(ch["charge_milli"]))}},
                )
            )
    try:
        client.transact_write_items(TransactItems=items)
    except ClientError as err:
        if error_code(err) == "TransactionCanceledException" and cancellation_reasons(err)[:1] == ["ConditionalCheckFailed"]:
            return False
        with translate_errors(TransientError, f"release of attempt {epoch} of {job_id} was cancelled"):
            raise
    return True


# ------------------------------------------------------------------ preemption, backoff


def request_preemption(client, names: TableNames, victim: Allocation, by_job: str, now: float) -> bool:
    """Ask the worker of ``victim`` to checkpoint and stop (fenced on its epoch). False if it moved on."""
    fence, fence_names, fence_values = epoch_condition(victim.epoch)
    asked = conditional_write(
        client.update_item,
        TableName=names.jobs,
        Key=marshal({"pk": job_pk(victim.job_id), "sk": JOB_META}),
        UpdateExpression="SET preempt_requested = :r, last_preempted_at = :t",
        ConditionExpression=fence,
        ExpressionAttributeNames=fence_names,
        ExpressionAttributeValues={
            ":r": marshal_value({"epoch": victim.epoch, "by": by_job, "at": iso(now)}),
            ":t": marshal_value(now),
            **fence_values,
        },
    )
    if asked is None:
        return False
    for m in victim.members:
        # an allocation record already gone (released) is skipped
        conditional_write(
            client.update_item,
            TableName=names.control,
            Key=marshal({"pk": alloc_pk(m.node or victim.pool), "sk": alloc_sk(victim.job_id, victim.epoch)}),
            UpdateExpression="SET preempt_requested = :y, last_preempted_at = :t",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":y": {"BOOL": True}, ":t": marshal_value(now)},
        )
    return True


def record_backoff(client, names: TableNames, job_id: str, until: float, reason: str, shape: str = "") -> None:
    """Remember an UNRESOLVABLE/ERROR backoff on a still-PENDING job (skipped if it moved on): until when, why, the
    cluster shape it was judged on (``sched_shape``; "" for none) and one more scheduling attempt
    (``sched_attempts``, the next backoff's exponent), in one conditional write."""
    conditional_write(
        client.update_item,
        TableName=names.jobs,
        Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}),
        UpdateExpression="SET sched_backoff_until = :u, sched_reason = :r, sched_shape = :f ADD sched_attempts :one",
        ConditionExpression="#s = :p",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":u": marshal_value(until), ":r": {"S": reason[:500]}, ":f": {"S": shape},
                                   ":one": {"N": "1"}, ":p": {"S": JobStatus.PENDING.value}},
    )


def record_reason(client, names: TableNames, job_id: str, reason: str) -> None:
    """Show why a still-PENDING job waits (``sched_reason``: capacity, quota, ...), without a backoff; skipped if
    the job moved on. The pass writes it only when the reason changed."""
    conditional_write(
        client.update_item,
        TableName=names.jobs,
        Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}),
        UpdateExpression="SET sched_reason = :r",
        ConditionExpression="#s = :p",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":r": {"S": reason[:500]}, ":p": {"S": JobStatus.PENDING.value}},
    )


def expire(job_id: str, token: str | None, reason: str, *, sfn=None) -> bool:
    """Fail a PENDING job's placement token with ``EXPIRED`` (its deadline passed before it started);
    ``False`` when there is no token or the workflow no longer waits on it."""
    if sfn is None or not token:
        return False
    try:
        sfn.send_task_failure(taskToken=token, error="EXPIRED", cause=json.dumps({"detail": reason, "job_id": job_id}))
    except ClientError as err:
        if error_code(err) in ("TaskDoesNotExist", "TaskTimedOut", "InvalidToken"):
            return False
        raise TransientError(f"expire {job_id}: {error_code(err)}") from err
    return True


# ------------------------------------------------------------------ the pass's port


class PlacementStore(Protocol):
    """The scheduler pass's writes (see the module docstring)."""

    def commit_many(self, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *, group: int = 20,
                    lane: str | None = None) -> list[CommitResult]: ...

    def escrow(self, lane: str) -> Amounts:
        """What lane ``lane``'s quota escrow holds (:mod:`gpufleet.store.escrow`)."""
        ...

    def reserve(self, lane: str, needs: Amounts, quotas: dict[str, QuotaNode]) -> Amounts:
        """Take ``needs`` into the lane's escrow as far as the quota limits allow; what was granted."""
        ...

    def give_back(self, lane: str, amounts: Amounts) -> None:
        """Return ``amounts`` of the lane's escrow to the quota items."""
        ...

    def request_preemption(self, victim: Allocation, by_job: str, now: float) -> bool: ...

    def record_backoff(self, job_id: str, until: float, reason: str, shape: str = "") -> None:
        """Record a backoff, its cluster shape ("" none) and one more scheduling attempt on a still-PENDING job."""
        ...

    def record_reason(self, job_id: str, reason: str) -> None: ...

    def expire(self, job_id: str, token: str | None, reason: str) -> bool:
        """Fail the job's placement token with ``EXPIRED``; whether a waiting workflow was told."""
        ...


class DynamoPlacementStore:
    """:class:`PlacementStore` over the jobs and control tables; ``sfn`` (a Step Functions client)
    completes placement tokens, None leaves them."""

    def __init__(self, client, names: TableNames, *, sfn=None) -> None:
        self.client = client
        self.names = names
        self.sfn = sfn

    def commit_many(self, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *, group: int = 20,
                    lane: str | None = None) -> list[CommitResult]:
        return commit_many(self.client, self.names, placements, quotas, now, sfn=self.sfn, group=group, lane=lane)

    def escrow(self, lane: str) -> Amounts:
        return escrow_read(self.client, self.names, lane)

    def reserve(self, lane: str, needs: Amounts, quotas: dict[str, QuotaNode]) -> Amounts:
        return escrow_reserve(self.client, self.names, lane, needs, quotas)

    def give_back(self, lane: str, amounts: Amounts) -> None:
        escrow_give_back(self.client, self.names, lane, amounts)

    def request_preemption(self, victim: Allocation, by_job: str, now: float) -> bool:
        return request_preemption(self.client, self.names, victim, by_job, now)

    def record_backoff(self, job_id: str, until: float, reason: str, shape: str = "") -> None:
        record_backoff(self.client, self.names, job_id, until, reason, shape)

    def record_reason(self, job_id: str, reason: str) -> None:
        record_reason(self.client, self.names, job_id, reason)

    def release(self, job_id: str, epoch: int, *, clock: Clock) -> bool:
        """:func:`release` (not part of the pass's port: the lifecycle releases)."""
        return release(self.client, job_id, epoch, names=self.names, clock=clock)

    def expire(self, job_id: str, token: str | None, reason: str) -> bool:
        return expire(job_id, token, reason, sfn=self.sfn)
