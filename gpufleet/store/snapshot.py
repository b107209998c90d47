"""What one scheduler pass reads: pending jobs, nodes, bookings, allocations, quotas, tenant defaults.

Items read (control table unless noted; keys from :mod:`gpufleet.tables`). Nothing is scanned: the
control table's items of the first four kinds are listed through its sparse directory index (gsi2,
``gsi2pk`` = ``DIR#NODES`` / ``DIR#USAGE`` / ``DIR#ALLOCATIONS`` / ``DIR#QUOTAS``, set by every writer of
those items); tenant items are read by key, projected to the placement policy (the tenant item also
holds the webhook signing secret):
- ``NODE#<id>``/``NODE`` — written by agents (docs/contracts.md, "Node item").
- ``ALLOC#<node>``/``BOOK`` — GPU bookings of a node: ``g<i>`` = milli booked on GPU i.
  A GPU's free milli for scheduling = min(agent-reported free, 1000 - booked).
- ``ALLOC#<pool>``/``POOL`` — ``used_milli`` of a cloud pool.
- ``ALLOC#<node|pool>``/``<job_id>#<epoch:08d>`` — one allocation record per gang member.
- ``QUOTA#<path>``/``QUOTA`` — quota configuration and usage counters (:mod:`gpufleet.store.quotas`).
- ``TENANT#<tenant>``/``TENANT`` — ``placement_policy`` default.
- ``POOL#<name>``/``POOL`` — an operator's pool definition, overlaid on the deployment's pools
  (:func:`gpufleet.pools.merge_pools`; an invalid one is left out).
- jobs table: PENDING job items through ``gsi3`` (its :data:`~gpufleet.tables.PENDING_PARTITIONS`, or a sharded
  pass's own partitions, :mod:`gpufleet.scheduler.shards`; queried side by side and merged in queue order),
  projected to what scheduling needs.

Contract: :class:`SnapshotReader` ``.load(pools, now)`` returns one
:class:`gpufleet.scheduler.model.Snapshot`; a malformed pending job is skipped, never fatal.
AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.clock import epoch_seconds
from gpufleet.pools import Pool, merge_pools
from gpufleet.scheduler.model import ANY, Allocation, Member, NodeState, PendingJob, QuotaNode, Snapshot
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.scheduler.shards import PassShard
from gpufleet.spec import Data, JobSpec, PlacementPolicy, PoolName, Resources
from gpufleet.status import JobStatus
from gpufleet.store.dynamo import marshal, paginate, translate_errors, unmarshal
from gpufleet.store.quotas import usage_from_item
from gpufleet.tables import (
    ALLOC_PREFIX,
    BOOK_SK,
    DIR_ALLOCATIONS,
    DIR_NODES,
    DIR_POOLS,
    DIR_QUOTAS,
    DIR_USAGE,
    DIRECTORY_ATTR,
    DIRECTORY_INDEX,
    NODE_PREFIX,
    NODE_SK,
    PENDING_PARTITIONS,
    POOL_CONFIG_SK,
    POOL_PREFIX,
    POOL_SK,
    QUOTA_PREFIX,
    TENANT_PREFIX,
    TENANT_SK,
    TableNames,
    tenant_pk,
)


def _ts(value: Any, default: float = 0.0) -> float:
    seconds = epoch_seconds(value)
    return default if seconds is None else seconds


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    kind: str | None = None
    image: str | None = None

    @property
    def image_pinned(self) -> bool:
        """False for a container image named by tag only (``repo:tag``, no ``@sha256:``): cloud pools refuse it."""
        return self.kind != "container" or "@sha256:" in (self.image or "")


class PendingSpec(BaseModel):
    """The part of a :class:`JobSpec` the pending projection carries (:data:`PENDING_PROJECTION`: the
    command, env and prompt stay behind, so a projected spec is not a whole ``JobSpec``). Its parts are
    ``JobSpec``'s own models and defaults; the workload contributes only its ``model``, ``kind`` and ``image``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    resources: Resources = JobSpec.model_fields["resources"]
    priority: int = JobSpec.model_fields["priority"]
    placement_policy: PlacementPolicy | None = JobSpec.model_fields["placement_policy"]
    data: Data = JobSpec.model_fields["data"]
    pools: list[PoolName] = JobSpec.model_fields["pools"]
    deadline: datetime | None = JobSpec.model_fields["deadline"]
    workload: _Model = Field(default_factory=_Model)


def job_from_item(item: dict[str, Any]) -> PendingJob:
    """A PENDING job item → :class:`PendingJob` (resources per gang member from the spec)."""
    spec = PendingSpec.model_validate(item.get("spec") or {})
    res, data = spec.resources, spec.data
    num_gpu, milli = (1, res.gpu_milli) if res.gpus < 1 else (int(res.gpus), MILLI)
    created = _ts(item.get("created_at"))
    return PendingJob(
        job_id=item["job_id"],
        tenant=item.get("tenant", "default"),
        team=item.get("team", "default"),
        user=item.get("user", "default"),
        priority=int(item.get("priority", spec.priority)),
        created_at=created,
        pending_since=_ts(item.get("pending_since"), _ts(item.get("updated_at"), created)),
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_type=res.gpu_type or ANY,
        cpu_milli=int(round(res.cpu * 1000)),
        memory_mib=int(round(res.memory_gb * 1024)),
        nodes=res.nodes,
        policy=spec.placement_policy.value if spec.placement_policy else None,
        residency=tuple(data.residency),
        inputs=tuple(data.inputs),
        input_gb=float(item.get("input_gb", 0.0)),
        model=spec.workload.model,
        observed_epoch=int(item.get("current_epoch", 0)),
        placement_token=item.get("placement_token"),
        attempts=int(item.get("attempt_count", 0)),
        backoff_until=float(item.get("sched_backoff_until", 0.0)),
        sched_attempts=int(item.get("sched_attempts", 0)),
        backoff_shape=str(item.get("sched_shape") or ""),
        last_preempted_at=item.get("last_preempted_at"),
        pools=tuple(spec.pools),
        avoid_nodes=frozenset(item.get("crashed_workers") or ()) | frozenset(item.get("failed_nodes") or ()),
        wait_reason=str(item.get("sched_reason") or ""),
        deadline=spec.deadline.timestamp() if spec.deadline else None,
        image_pinned=spec.workload.image_pinned,
    )


#: top-level attributes of the job item the pass reads
_TOP_NAMES = (
    "job_id", "tenant", "team", "user", "priority", "created_at", "updated_at", "pending_since", "status",
    "current_epoch", "placement_token", "attempt_count", "sched_backoff_until", "last_preempted_at", "input_gb",
    "crashed_workers", "failed_nodes", "sched_reason", "sched_attempts", "sched_shape", "gsi3sk",
)
_PROJECTED_NAMES = _TOP_NAMES + ("spec", "resources", "placement_policy", "data", "workload", "model", "pools",
                                 "deadline", "kind", "image")
PENDING_PROJECTION = tuple(f"#{a}" for a in _TOP_NAMES) + (
    "#spec.#resources", "#spec.#placement_policy", "#spec.#priority", "#spec.#data", "#spec.#workload.#model",
    "#spec.#pools", "#spec.#deadline", "#spec.#workload.#kind", "#spec.#workload.#image",
)


def _query_partition(client, table: str, part: str, limit: int | None) -> list[dict[str, Any]]:
    return list(paginate(
        client.query,
        limit=limit,
        TableName=table,
        IndexName="gsi3",
        KeyConditionExpression="gsi3pk = :p",
        ExpressionAttributeValues={":p": {"S": part}},
        # only what scheduling needs: the command, env and prompt stay behind
        ProjectionExpression=", ".join(PENDING_PROJECTION),
        ExpressionAttributeNames={f"#{a}": a for a in _PROJECTED_NAMES},
    ))


def merge_pending(partitions: list[list[dict[str, Any]]], limit: int | None) -> list[dict[str, Any]]:
    """The PENDING queue in order (``gsi3sk``: priority, then age, then id) from its partitions' items (each
    already in that order, as a Query returns them), cut to ``limit``."""
    merged = heapq.merge(*partitions, key=lambda it: str(it.get("gsi3sk", "")))
    return list(itertools.islice(merged, limit))


#: the most queries one snapshot has in flight at once (its pending and directory partitions together; botocore keeps
#: 10 connections per client by default)
READ_PARALLELISM = 10


def _query_pending(client, table: str, limit: int | None,
                   partitions: tuple[str, ...] = PENDING_PARTITIONS) -> list[dict[str, Any]]:
    """Every PENDING job of ``partitions`` (index gsi3; all :data:`~gpufleet.tables.PENDING_PARTITIONS` unless a
    shard reads only its own; queried side by side), in queue order, at most ``limit`` (each partition is read up
    to ``limit``: the first ``limit`` overall are among them)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(partitions)))) as pool:
        parts = list(pool.map(lambda part: _query_partition(client, table, part, limit), partitions))
    return merge_pending(parts, limit)


def _read_side_by_side(client, names: TableNames, limit: int | None, partitions: tuple[str, ...],
                       parts: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pending partitions (none when ``limit`` is 0) and the directory partitions ``parts``, queried side by side
    (:data:`READ_PARALLELISM` at a time): a snapshot costs a few query round trips, not one per partition."""
    pending_parts = partitions if limit != 0 else ()
    with ThreadPoolExecutor(max_workers=max(1, min(READ_PARALLELISM, len(pending_parts) + len(parts)))) as pool:
        pending = [pool.submit(_query_partition, client, names.jobs, part, limit) for part in pending_parts]
        control = [pool.submit(query_directory, client, names.control, part) for part in parts]
        return (merge_pending([f.result() for f in pending], limit) if pending_parts else [],
                [it for f in control for it in f.result()])


def query_directory(client, table: str, part: str) -> list[dict[str, Any]]:
    """Every control-table item listed under directory partition ``part`` (``DIR#NODES``, ...; index gsi2)."""
    return list(paginate(
        client.query,
        TableName=table,
        IndexName=DIRECTORY_INDEX,
        KeyConditionExpression="#d = :d",
        ExpressionAttributeNames={"#d": DIRECTORY_ATTR},
        ExpressionAttributeValues={":d": {"S": part}},
    ))


#: what the scheduler reads of a tenant item: its default placement policy (never the webhook secret)
TENANT_PROJECTION = ("pk", "placement_policy")


def tenant_policies(client, table: str, tenants: set[str]) -> dict[str, str]:
    """The default placement policy of each of ``tenants`` that has one (``TENANT#<t>``/``TENANT``, read
    with a projection of :data:`TENANT_PROJECTION` only)."""
    keys = [marshal({"pk": tenant_pk(t), "sk": TENANT_SK}) for t in sorted(tenants)]
    out: dict[str, str] = {}
    for i in range(0, len(keys), 100):  # BatchGetItem takes at most 100 keys
        request: dict[str, Any] = {table: {
            "Keys": keys[i:i + 100],
            "ProjectionExpression": ", ".join(f"#a{n}" for n in range(len(TENANT_PROJECTION))),
            "ExpressionAttributeNames": {f"#a{n}": a for n, a in enumerate(TENANT_PROJECTION)},
        }}
        while request:
            resp = client.batch_get_item(RequestItems=request)
            for raw in resp.get("Responses", {}).get(table, []):
                it = unmarshal(raw) or {}
                if it.get("placement_policy"):
                    out[it["pk"][len(TENANT_PREFIX):]] = it["placement_policy"]
            request = resp.get("UnprocessedKeys") or {}
    return out


def _node_state(it: dict[str, Any], book: dict[str, Any]) -> NodeState:
    gpus = sorted(it.get("gpus") or [], key=lambda g: int(g.get("index", 0)))
    free = tuple(
        max(0, min(int(g.get("milli_free", MILLI)), MILLI - int(book.get(f"g{int(g.get('index', i))}", 0))))
        for i, g in enumerate(gpus)
    )
    return NodeState(
        node_id=it["node_id"],
        pool=it.get("pool", ""),
        gpu_type=it.get("gpu_type", "any"),
        gpu_free=free,
        cpu_milli_free=int(it.get("cpu_milli_free", 0)),
        memory_mib_free=int(it.get("memory_mib_free", 0)),
        queue_url=it.get("queue_url", ""),
        labels=tuple(sorted((it.get("labels") or {}).items())),
        cached_models=frozenset(it.get("cached_models") or ()),
        resident_models=frozenset(it.get("resident_models") or ()),
        datasets=frozenset(it.get("datasets") or ()),
        draining=bool(it.get("draining", False)),
        expires_at=float(it.get("expires_at", float("inf"))),
        topology=str(it.get("gpu_topology") or ""),
    )


def _allocation(job_id: str, epoch: int, members: list[dict[str, Any]]) -> Allocation:
    m0 = members[0]
    return Allocation(
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


#: the directory partitions a scheduler pass lists; the pools view needs only the first two
SCHEDULER_DIRECTORY = (DIR_NODES, DIR_USAGE, DIR_ALLOCATIONS, DIR_QUOTAS, DIR_POOLS)
CAPACITY_DIRECTORY = (DIR_NODES, DIR_USAGE, DIR_POOLS)


def load_capacity(client, names: TableNames, pools: tuple[Pool, ...], now: float) -> Snapshot:
    """Nodes with their bookings and cloud pool usage only (``GET /v1/pools``): a :class:`Snapshot`
    without jobs, allocations, quotas or tenant defaults, read from ``DIR#NODES`` and ``DIR#USAGE``."""
    return load_snapshot(client, names, pools, now, limit=0, parts=CAPACITY_DIRECTORY)


def load_snapshot(client, names: TableNames, pools: tuple[Pool, ...], now: float, *, limit: int | None = None,
                  parts: tuple[str, ...] = SCHEDULER_DIRECTORY, shard: PassShard | None = None) -> Snapshot:
    """Read pending jobs (gsi3, the partitions of ``shard`` — all when None; none when ``limit`` is 0); the
    directory partitions ``parts`` of the control table (index gsi2: nodes, bookings, allocations, quotas); the
    default placement policy of the pending jobs' tenants (by key). No Scan."""
    shard = shard or PassShard()
    with translate_errors():
        pending, control = _read_side_by_side(client, names, limit, shard.partitions, parts)

    def policies(tenants: set[str]) -> dict[str, str]:
        with translate_errors():
            return tenant_policies(client, names.control, tenants)

    return assemble_snapshot(pending, control, policies, pools, now, shard=shard)


def _owned_allocation(members: list[dict[str, Any]], shard: PassShard) -> bool:
    """A running allocation a shard sees: on a cloud pool (global), or with every member on the shard's nodes (a
    gang across shards is no shard's preemption candidate in this round)."""
    nodes = [m.get("node") for m in members]
    return all(n is None for n in nodes) or all(n is not None and shard.owns_node(n) for n in nodes)


def assemble_snapshot(pending: list[dict[str, Any]], control: list[dict[str, Any]],
                      policies: Callable[[set[str]], dict[str, str]], pools: tuple[Pool, ...],
                      now: float, *, shard: PassShard | None = None) -> Snapshot:
    """One :class:`Snapshot` from the items a pass read: ``pending`` job items (gsi3 order), the ``control``
    items of the directory partitions, and ``policies`` (tenants → their default placement policy), asked
    only when a job is pending. With a ``shard``, only its on-prem nodes (and their bookings and allocations)
    are kept; cloud pools, quotas and tenant defaults are global (:mod:`gpufleet.scheduler.shards`). Shared by
    the DynamoDB reader and its in-memory fake."""
    shard = shard or PassShard()
    jobs = []
    for item in pending:
        if item.get("status") != JobStatus.PENDING.value:
            continue
        try:
            jobs.append(job_from_item(item))
        except (ValueError, KeyError, TypeError):
            continue  # a malformed job cannot be scheduled; the API validated it, so this is defensive
    node_items, books, pool_use, allocs, quotas, usage = [], {}, {}, defaultdict(list), {}, {}
    tenants: dict[str, str] = {}
    pool_docs: list[dict] = []
    for it in control:
        pk, sk = it["pk"], it["sk"]
        if pk.startswith(NODE_PREFIX) and sk == NODE_SK:
            node_items.append(it)
        elif pk.startswith(ALLOC_PREFIX) and sk == BOOK_SK:
            books[pk[len(ALLOC_PREFIX):]] = it
        elif pk.startswith(ALLOC_PREFIX) and sk == POOL_SK:
            pool_use[pk[len(ALLOC_PREFIX):]] = int(it.get("used_milli", 0))
        elif pk.startswith(ALLOC_PREFIX):
            allocs[(it["job_id"], int(it["epoch"]))].append(it)
        elif pk.startswith(QUOTA_PREFIX):
            path = pk[len(QUOTA_PREFIX):]
            if it.get("guarantee") is not None or it.get("borrow_limit") is not None:
                quotas[path] = QuotaNode(
                    path,
                    {k: int(v) for k, v in (it.get("guarantee") or {}).items()},
                    {k: int(v) for k, v in (it.get("borrow_limit") or {}).items()},
                    {k: float(v) for k, v in (it.get("weight") or {}).items()},
                )
            usage[path] = usage_from_item(it)
        elif pk.startswith(POOL_PREFIX) and sk == POOL_CONFIG_SK:
            pool_docs.append(it)
    if jobs:
        tenants = policies({j.tenant for j in jobs})
    nodes = [_node_state(it, books.get(it["node_id"], {})) for it in node_items if shard.owns_node(it["node_id"])]
    running = [_allocation(job_id, epoch, members) for (job_id, epoch), members in allocs.items()
               if shard.whole or _owned_allocation(members, shard)]
    return Snapshot(
        now=now,
        jobs=tuple(jobs),
        nodes=tuple(nodes),
        pools=merge_pools(tuple(pools), pool_docs, skip_invalid=True),
        quotas=quotas,
        usage=usage,
        running=tuple(running),
        pool_used=pool_use,
        tenant_policy=tenants,
    )


class SnapshotReader(Protocol):
    def load(self, pools: tuple[Pool, ...], now: float, *, limit: int | None = None,
             shard: PassShard | None = None) -> Snapshot: ...


class DynamoSnapshotReader:
    """:class:`SnapshotReader` over the jobs and control tables."""

    def __init__(self, client, names: TableNames) -> None:
        self.client = client
        self.names = names

    def load(self, pools: tuple[Pool, ...], now: float, *, limit: int | None = None,
             shard: PassShard | None = None) -> Snapshot:
        return load_snapshot(self.client, self.names, pools, now, limit=limit, shard=shard)

