"""The scheduler's DynamoDB side: snapshot loading, the commit transaction, release.

Items (control table unless noted; keys from :mod:`gpufleet.tables`):
- ``NODE#<id>``/``NODE`` — written by agents (docs/contracts.md, "Node item").
- ``ALLOC#<node>``/``BOOK`` — GPU bookings of a node: ``g<i>`` = milli booked on GPU i.
  A GPU's free milli for scheduling = min(agent-reported free, 1000 - booked).
- ``ALLOC#<pool>``/``POOL`` — ``used_milli`` of a cloud pool.
- ``ALLOC#<node|pool>``/``<job_id>#<epoch:08d>`` — one allocation record per gang member
  (``gsi1pk=OWNER#<owner path>``).
- ``QUOTA#<path>``/``QUOTA`` — ``guarantee``/``borrow_limit``/``weight``/``limits`` maps
  (GPU type → milli; ``*`` = all types) and usage counters ``used_<type>`` / ``used_all``.
- ``TENANT#<tenant>``/``TENANT`` — ``placement_policy`` default (read only here).
- jobs table: the job item (PENDING→SCHEDULED) and ``ATTEMPT#<epoch>`` items.

:func:`commit` writes one placement in ONE ``TransactWriteItems``: the job moves
PENDING→SCHEDULED with a new fencing epoch (``current_epoch`` must still be the
epoch the snapshot saw — :func:`gpufleet.store.fencing.issue_epoch` semantics), the
attempt item is created, every GPU booking is raised only if it stays <= 1000 milli,
cloud pool usage only if it stays <= ``max_gpus``, and every quota level's usage only
if it stays within that level's limit. Two passes racing over the same snapshot
cannot both win: the loser's transaction is cancelled and its job stays PENDING.
Only then is the job's placement token completed with the placement JSON.

:func:`release` undoes an attempt's bookings, allocation records and quota usage,
once (the attempt item records ``released_at`` conditionally).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock, iso
from gpufleet.errors import Conflict, NotFound, TransientError
from gpufleet.pools import Pool
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import (
    ALL_TYPES,
    ANY,
    Allocation,
    Member,
    NodeState,
    PendingJob,
    QuotaNode,
    Snapshot,
    ancestors,
)
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.status import AttemptState, JobStatus
from gpufleet.store.dynamo import cancellation_reasons, error_code, marshal, marshal_value, unmarshal
from gpufleet.store.jobs import build_event, transition_update
from gpufleet.tables import JOB_META, PENDING_PARTITION, TableNames, attempt_sk, job_pk, node_pk, quota_pk

BOOK_SK = "BOOK"
POOL_SK = "POOL"
QUOTA_SK = "QUOTA"
NODE_SK = "NODE"
#: most items one placement may touch (DynamoDB allows 100 per transaction)
MAX_TRANSACTION_ITEMS = 100


def alloc_pk(node_or_pool: str) -> str:
    return f"ALLOC#{node_or_pool}"


def alloc_sk(job_id: str, epoch: int) -> str:
    return f"{job_id}#{epoch:08d}"


def usage_attr(gpu_type: str) -> str:
    return "used_all" if gpu_type == ALL_TYPES else f"used_{gpu_type}"


def _ts(value: Any, default: float = 0.0) -> float:
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


# ------------------------------------------------------------------ writes used by admins/tests


def put_quota(client, table: str, node: QuotaNode) -> None:
    """Create or replace a quota node's configuration, keeping its usage counters."""
    limits = {t: node.limit(t) for t in set(node.guarantee) | set(node.borrow_limit)}
    client.update_item(
        TableName=table,
        Key=marshal({"pk": quota_pk(node.path), "sk": QUOTA_SK}),
        UpdateExpression="SET guarantee = :g, borrow_limit = :b, weight = :w, limits = :l, #p = :p",
        ExpressionAttributeNames={"#p": "path"},
        ExpressionAttributeValues={
            ":g": marshal_value(dict(node.guarantee)),
            ":b": marshal_value(dict(node.borrow_limit)),
            ":w": marshal_value({k: float(v) for k, v in node.weight.items()}),
            ":l": marshal_value(limits),
            ":p": marshal_value(node.path),
        },
    )


# ------------------------------------------------------------------ snapshot


def job_from_item(item: dict[str, Any]) -> PendingJob:
    """A PENDING job item → :class:`PendingJob` (resources per gang member from the spec)."""
    spec = item.get("spec") or {}
    res = spec.get("resources") or {}
    data = spec.get("data") or {}
    workload = spec.get("workload") or {}
    gpus = float(res.get("gpus", 1))
    num_gpu, milli = (1, int(round(gpus * MILLI))) if gpus < 1 else (int(gpus), MILLI)
    created = _ts(item.get("created_at"))
    return PendingJob(
        job_id=item["job_id"],
        tenant=item.get("tenant", "default"),
        team=item.get("team", "default"),
        user=item.get("user", "default"),
        priority=int(item.get("priority", spec.get("priority", 100))),
        created_at=created,
        pending_since=_ts(item.get("pending_since"), _ts(item.get("updated_at"), created)),
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_type=res.get("gpu_type", ANY) or ANY,
        cpu_milli=int(round(float(res.get("cpu", 1)) * 1000)),
        memory_mib=int(round(float(res.get("memory_gb", 4)) * 1024)),
        nodes=int(res.get("nodes", 1)),
        policy=spec.get("placement_policy"),
        residency=tuple(data.get("residency") or ()),
        inputs=tuple(data.get("inputs") or ()),
        input_gb=float(item.get("input_gb", 0.0)),
        model=workload.get("model"),
        observed_epoch=int(item.get("current_epoch", 0)),
        placement_token=item.get("placement_token"),
        attempts=int(item.get("attempt_count", 0)),
        backoff_until=float(item.get("sched_backoff_until", 0.0)),
        last_preempted_at=item.get("last_preempted_at"),
        pools=tuple(spec.get("pools") or ()),
        avoid_nodes=frozenset(item.get("crashed_workers") or ()) | frozenset(item.get("failed_nodes") or ()),
    )


#: top-level attributes of the job item the pass reads
_TOP_NAMES = (
    "job_id", "tenant", "team", "user", "priority", "created_at", "updated_at", "pending_since", "status",
    "current_epoch", "placement_token", "attempt_count", "sched_backoff_until", "last_preempted_at", "input_gb",
    "crashed_workers", "failed_nodes",
)
_PROJECTED_NAMES = _TOP_NAMES + ("spec", "resources", "placement_policy", "data", "workload", "model", "pools")
PENDING_PROJECTION = tuple(f"#{a}" for a in _TOP_NAMES) + (
    "#spec.#resources", "#spec.#placement_policy", "#spec.#priority", "#spec.#data", "#spec.#workload.#model",
    "#spec.#pools",
)


def _query_pending(client, table: str, limit: int | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "IndexName": "gsi3",
        "KeyConditionExpression": "gsi3pk = :p",
        "ExpressionAttributeValues": {":p": {"S": PENDING_PARTITION}},
        # only what scheduling needs: the command, env and prompt stay behind
        "ProjectionExpression": ", ".join(PENDING_PROJECTION),
        "ExpressionAttributeNames": {f"#{a}": a for a in _PROJECTED_NAMES},
    }
    while True:
        resp = client.query(**kwargs)
        out.extend(unmarshal(i) for i in resp.get("Items", []))
        if limit is not None and len(out) >= limit:
            return out[:limit]
        if "LastEvaluatedKey" not in resp:
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _scan_control(client, table: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "FilterExpression": "begins_with(pk, :n) OR begins_with(pk, :a) OR begins_with(pk, :q) OR begins_with(pk, :t)",
        "ExpressionAttributeValues": {":n": {"S": "NODE#"}, ":a": {"S": "ALLOC#"}, ":q": {"S": "QUOTA#"}, ":t": {"S": "TENANT#"}},
    }
    while True:
        resp = client.scan(**kwargs)
        out.extend(unmarshal(i) for i in resp.get("Items", []))
        if "LastEvaluatedKey" not in resp:
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def load_snapshot(client, names: TableNames, pools: tuple[Pool, ...], now: float, *, limit: int | None = None) -> Snapshot:
    """Read pending jobs (gsi3), nodes, bookings, allocations, quotas and tenant defaults."""
    jobs = []
    for item in _query_pending(client, names.jobs, limit):
        if item.get("status") != JobStatus.PENDING.value:
            continue
        try:
            jobs.append(job_from_item(item))
        except (ValueError, KeyError, TypeError):
            continue  # a malformed job cannot be scheduled; the API validated it, so this is defensive
    node_items, books, pool_use, allocs, quotas, usage, tenants = [], {}, {}, defaultdict(list), {}, {}, {}
    for it in _scan_control(client, names.control):
        pk, sk = it["pk"], it["sk"]
        if pk.startswith("NODE#") and sk == NODE_SK:
            node_items.append(it)
        elif pk.startswith("ALLOC#") and sk == BOOK_SK:
            books[pk[6:]] = it
        elif pk.startswith("ALLOC#") and sk == POOL_SK:
            pool_use[pk[6:]] = int(it.get("used_milli", 0))
        elif pk.startswith("ALLOC#"):
            allocs[(it["job_id"], int(it["epoch"]))].append(it)
        elif pk.startswith("QUOTA#"):
            path = pk[6:]
            if it.get("guarantee") is not None or it.get("borrow_limit") is not None:
                quotas[path] = QuotaNode(
                    path,
                    {k: int(v) for k, v in (it.get("guarantee") or {}).items()},
                    {k: int(v) for k, v in (it.get("borrow_limit") or {}).items()},
                    {k: float(v) for k, v in (it.get("weight") or {}).items()},
                )
            usage[path] = {
                (ALL_TYPES if k == "used_all" else k[5:]): int(v) for k, v in it.items() if k.startswith("used_")
            }
        elif pk.startswith("TENANT#") and it.get("placement_policy"):
            tenants[pk[7:]] = it["placement_policy"]
    nodes = []
    for it in node_items:
        book = books.get(it["node_id"], {})
        gpus = sorted(it.get("gpus") or [], key=lambda g: int(g.get("index", 0)))
        free = tuple(
            max(0, min(int(g.get("milli_free", MILLI)), MILLI - int(book.get(f"g{int(g.get('index', i))}", 0))))
            for i, g in enumerate(gpus)
        )
        nodes.append(
            NodeState(
                node_id=it["node_id"],
                pool=it.get("pool", ""),
                gpu_type=it.get("gpu_type", "any"),
                gpu_free=free,
                cpu_milli_free=int(it.get("cpu_milli_free", 0)),
                memory_mib_free=int(it.get("memory_mib_free", 0)),
                queue_url=it.get("queue_url", ""),
                labels=tuple(sorted((it.get("labels") or {}).items())),
                cached_models=frozenset(it.get("cached_models") or ()),
                datasets=frozenset(it.get("datasets") or ()),
                draining=bool(it.get("draining", False)),
                expires_at=float(it.get("expires_at", float("inf"))),
            )
        )
    running = []
    for (job_id, epoch), members in allocs.items():
        m0 = members[0]
        running.append(
            Allocation(
                job_id=job_id,
                epoch=epoch,
                owner_path=m0.get("owner_path", ""),
                priority=int(m0.get("priority", 100)),
                pool=m0.get("pool", ""),
                gpu_type=m0.get("gpu_type", ""),
                members=tuple(
                    Member(m.get("node"), tuple(int(g) for g in m.get("gpu_indices") or ()), m.get("queue_url", ""))
                    for m in sorted(members, key=lambda m: m["sk"])
                ),
                gpu_milli=int(m0.get("gpu_milli", MILLI)),
                num_gpu=int(m0.get("num_gpu", 1)),
                cpu_milli=int(m0.get("cpu_milli", 0)),
                memory_mib=int(m0.get("memory_mib", 0)),
                started_at=float(m0.get("started_at", 0.0)),
                checkpoint_at=m0.get("checkpoint_at"),
                last_preempted_at=m0.get("last_preempted_at"),
                preempt_requested=bool(m0.get("preempt_requested", False)),
            )
        )
    return Snapshot(
        now=now,
        jobs=tuple(jobs),
        nodes=tuple(nodes),
        pools=tuple(pools),
        quotas=quotas,
        usage=usage,
        running=tuple(running),
        pool_used=pool_use,
        tenant_policy=tenants,
    )


# ------------------------------------------------------------------ commit


@dataclass(frozen=True)
class CommitResult:
    job_id: str
    ok: bool
    epoch: int = 0
    reason: str = ""


def _upd(table: str, key: dict[str, Any], expr: str, names: dict[str, str], values: dict[str, Any], cond: str | None = None) -> dict[str, Any]:
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
        {"Put": {"TableName": names.jobs, "Item": marshal(attempt), "ConditionExpression": "attribute_not_exists(pk)"}},
        # the timeline shows the placement, written in the same transaction as the move itself
        {"Put": {"TableName": names.jobs, "Item": marshal(build_event(job.job_id, "status", now, {
            "from": [JobStatus.PENDING.value], "to": JobStatus.SCHEDULED.value, "epoch": epoch,
            "pool": p.pool.name, "nodes": [m.node for m in p.members]})),
            "ConditionExpression": "attribute_not_exists(pk)"}},
    ]
    record = {
        "job_id": job.job_id,
        "epoch": epoch,
        "owner_path": job.owner_path,
        "gsi1pk": f"OWNER#{job.owner_path}",
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
        own.append({"Put": {"TableName": names.control, "Item": marshal({"pk": alloc_pk(p.pool.name), "sk": alloc_sk(job.job_id, epoch), **record}), "ConditionExpression": "attribute_not_exists(pk)"}})
    else:
        for m in p.members:
            books[m.node] = {g: per_gpu for g in m.gpu_indices}
            item = {"pk": alloc_pk(m.node), "sk": alloc_sk(job.job_id, epoch), **record, "node": m.node, "gpu_indices": list(m.gpu_indices), "queue_url": m.queue_url}
            own.append({"Put": {"TableName": names.control, "Item": marshal(item), "ConditionExpression": "attribute_not_exists(pk)"}})
    quota = [(path, p.gpu_type, p.charge_milli) for path in ancestors(job.owner_path)]
    return _Parts(p, epoch, doc, own, books, (p.pool.name, p.charge_milli) if cloud else None, quota)


def _shared_items(names: TableNames, parts: list[_Parts], quotas: dict[str, QuotaNode], pools: dict[str, Pool]) -> list[dict[str, Any]]:
    """Aggregated, conditioned updates of GPU bookings, cloud pool usage and quota usage."""
    items: list[dict[str, Any]] = []
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


def placement_items(names: TableNames, p: Placement, quotas: dict[str, QuotaNode], now: float) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """The single-placement transaction for ``p`` → (items, new epoch, placement JSON)."""
    pt = _parts(names, p, now)
    items = pt.own + _shared_items(names, [pt], quotas, {p.pool.name: p.pool})
    if len(items) > MAX_TRANSACTION_ITEMS:
        raise Conflict(f"placement of {p.job.job_id} needs {len(items)} transaction items (max {MAX_TRANSACTION_ITEMS})")
    return items, pt.epoch, pt.doc


def _transact(client, items: list[dict[str, Any]]) -> str | None:
    """Run a transaction; None on success, else the reason it was cancelled."""
    try:
        client.transact_write_items(TransactItems=items)
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
            # The workflow no longer waits (timed out / cancelled): give the capacity back.
            release(client, job.job_id, pt.epoch, names=names)
            return CommitResult(job.job_id, False, pt.epoch, reason=f"token: {error_code(err)}")
    return CommitResult(job.job_id, True, pt.epoch)


def commit(client, names: TableNames, p: Placement, quotas: dict[str, QuotaNode], now: float, *, sfn=None) -> CommitResult:
    """Commit one placement atomically, then complete the job's placement token (see module docstring)."""
    try:
        items, _, _ = placement_items(names, p, quotas, now)
    except Conflict as err:
        return CommitResult(p.job.job_id, False, reason=str(err))
    reason = _transact(client, items)
    if reason is not None:
        return CommitResult(p.job.job_id, False, reason=reason)
    return _complete(client, names, _parts(names, p, now), sfn)


def commit_many(client, names: TableNames, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *, sfn=None, group: int = 20) -> list[CommitResult]:
    """Group commit: up to ``group`` placements per transaction (shared counters aggregated,
    each condition on the group's total). A cancelled group falls back to one transaction
    per placement, so one lost race costs only that job. Tokens are completed after the
    transaction that placed the job."""
    results: list[CommitResult] = []
    pools = {p.pool.name: p.pool for p in placements}
    batch: list[_Parts] = []

    def flush(batch: list[_Parts]) -> None:
        if not batch:
            return
        try:
            items = [it for pt in batch for it in pt.own] + _shared_items(names, batch, quotas, pools)
            reason = _transact(client, items) if len(items) <= MAX_TRANSACTION_ITEMS else "too large"
        except Conflict as err:
            reason = str(err)
        if reason is None:
            results.extend(_complete(client, names, pt, sfn) for pt in batch)
        elif len(batch) == 1:
            results.append(commit(client, names, batch[0].placement, quotas, now, sfn=sfn))
        else:
            for pt in batch:
                results.append(commit(client, names, pt.placement, quotas, now, sfn=sfn))

    count = 0
    for p in placements:
        pt = _parts(names, p, now)
        size = len(pt.own) + len(pt.books) + (1 if pt.pool else 0) + len(pt.quota)
        if batch and (len(batch) >= group or count + size > MAX_TRANSACTION_ITEMS // 2):
            flush(batch)
            batch, count = [], 0
        batch.append(pt)
        count += size
    flush(batch)
    return results


# ------------------------------------------------------------------ release


def release(client, job_id: str, epoch: int, *, names: TableNames | None = None, clock: Clock | None = None) -> bool:
    """Give back the capacity and quota of attempt ``epoch`` of ``job_id``. Idempotent.

    Returns True when this call released it, False when it was already released.
    Raises :class:`NotFound` when the attempt does not exist.
    """
    names = names or TableNames.from_env()
    got = client.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}), ConsistentRead=True)
    att = unmarshal(got.get("Item"))
    if att is None:
        raise NotFound(f"attempt {epoch} of {job_id} not found")
    if att.get("released_at") is not None:
        return False
    ch = att.get("charge") or {}
    stamp = iso((clock or SystemClock()).now())
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
        raise
    return True


# ------------------------------------------------------------------ preemption, backoff


def request_preemption(client, names: TableNames, victim: Allocation, by_job: str, now: float) -> bool:
    """Ask the worker of ``victim`` to checkpoint and stop (fenced on its epoch). False if it moved on."""
    try:
        client.update_item(
            TableName=names.jobs,
            Key=marshal({"pk": job_pk(victim.job_id), "sk": JOB_META}),
            UpdateExpression="SET preempt_requested = :r, last_preempted_at = :t",
            ConditionExpression="current_epoch = :e",
            ExpressionAttributeValues={
                ":r": marshal_value({"epoch": victim.epoch, "by": by_job, "at": iso(now)}),
                ":t": marshal_value(now),
                ":e": {"N": str(victim.epoch)},
            },
        )
    except ClientError as err:
        if error_code(err) == "ConditionalCheckFailedException":
            return False
        raise
    for m in victim.members:
        key = {"pk": alloc_pk(m.node or victim.pool), "sk": alloc_sk(victim.job_id, victim.epoch)}
        try:
            client.update_item(
                TableName=names.control,
                Key=marshal(key),
                UpdateExpression="SET preempt_requested = :y, last_preempted_at = :t",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={":y": {"BOOL": True}, ":t": marshal_value(now)},
            )
        except ClientError as err:
            if error_code(err) != "ConditionalCheckFailedException":
                raise
    return True


def record_backoff(client, names: TableNames, job_id: str, until: float, reason: str) -> None:
    """Remember an UNRESOLVABLE/ERROR backoff on a still-PENDING job (skipped if it moved on)."""
    try:
        client.update_item(
            TableName=names.jobs,
            Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}),
            UpdateExpression="SET sched_backoff_until = :u, sched_reason = :r",
            ConditionExpression="#s = :p",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":u": marshal_value(until), ":r": {"S": reason[:500]}, ":p": {"S": JobStatus.PENDING.value}},
        )
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            raise


def put_node(client, table: str, node: dict[str, Any]) -> None:
    """Write a node item as an agent would (used by tests, benchmarks and the local stack)."""
    client.put_item(TableName=table, Item=marshal({"pk": node_pk(node["node_id"]), "sk": NODE_SK, **node}))
