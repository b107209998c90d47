"""What GPU-time attribution needs for a window, read from the tables (:mod:`gpufleet.diagnose.attribution`).

Contract: :meth:`DiagnosisReader.window` returns frozen
:class:`~gpufleet.diagnose.attribution.Inputs` for ``[since, until)`` and an optional pool, from:
- the nodes: the control table's ``DIR#NODES`` liveness items (pool, GPU count, ``draining``), as the
  scheduler's snapshot reads them (:func:`gpufleet.store.snapshot.query_directory`);
- the attempts that booked GPUs: those holding GPUs now (``DIR#ALLOCATIONS``: still booked, no end) and
  those billed since ``since`` (each tenant's ledger entries, :func:`gpufleet.store.ledger.tenant_entries`;
  the entry's ``at`` is the end of the booking). Tenants: ``DIR#TENANTS`` (keys only) plus the owners of current
  allocations and PENDING jobs. Each attempt item gives its members' nodes and GPU indices
  (``charge.members``), ``created_at`` (placed) and its phase marks (:func:`gpufleet.phases.attempt_marks`);
  cloud attempts (no node) are left out: a cloud pool has no idle capacity to lose;
- the PENDING intervals: jobs PENDING now (index gsi3: ``pending_since`` to now, the recorded
  ``sched_reason``), and each read attempt's wait before it was placed: from the job's last ``status`` event
  to PENDING before ``placed`` (its timeline, one Query of ``EVENT#`` items) to ``placed``, with the job
  item's last ``sched_reason`` for its current attempt (an earlier attempt's reason is not kept: none).
Attempts read are capped at ``max_attempts`` (most recent bills first); :attr:`DynamoDiagnosisReader.truncated`
says when the cap cut some. Reads only (Query on indexes, GetItem); AWS errors become
:mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from gpufleet.clock import iso
from gpufleet.diagnose.attribution import Booking, Inputs, NodeInventory, PendingInterval
from gpufleet.phases import attempt_marks
from gpufleet.store import ledger
from gpufleet.store.dynamo import marshal, paginate, translate_errors, unmarshal
from gpufleet.store.snapshot import _query_pending as query_pending
from gpufleet.store.snapshot import job_from_item, query_directory
from gpufleet.tables import (
    ALLOC_PREFIX,
    DIR_ALLOCATIONS,
    DIR_NODES,
    DIR_TENANTS,
    DIRECTORY_ATTR,
    DIRECTORY_INDEX,
    EVENT_PREFIX,
    JOB_META,
    NODE_SK,
    TENANT_PREFIX,
    TENANT_SK,
    TableNames,
    attempt_sk,
    job_pk,
)

#: what the reader takes of a job item (projected: never the prompt or the command): the wait before its
#: current attempt, the GPUs and pools it asked for
JOB_PROJECTION = "#c, #r, #s.#res.#g, #s.#pools"
JOB_NAMES = {"#c": "current_epoch", "#r": "sched_reason", "#s": "spec", "#res": "resources", "#g": "gpus",
             "#pools": "pools"}
#: what the reader takes of a timeline event
EVENT_PROJECTION = {"ProjectionExpression": "#t, #k, #d.#to",
                    "ExpressionAttributeNames": {"#t": "ts", "#k": "kind", "#d": "detail", "#to": "to"}}


def _ts(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


class DiagnosisReader(Protocol):
    def _pending_since(self, job_id: str, placed: float) -> float | None:
        """When the job last became PENDING before ``placed`` (its timeline's status events)."""
        events = paginate(self.client.query, TableName=self.names.jobs,
                          KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
                          ExpressionAttributeValues=marshal({":pk": job_pk(job_id), ":lo": EVENT_PREFIX,
                                                             ":hi": f"{EVENT_PREFIX}{iso(placed)}~"}),
                          **EVENT_PROJECTION)
        last = None
        for e in events:
            at = _ts(e.get("ts"))
            if e.get("kind") == "status" and (e.get("detail") or {}).get("to") == "PENDING" and at is not None \
                    and at <= placed:
                last = at
        return last

    def window(self, since: float, until: float, pool: str | None = None) -> Inputs: ...


class DynamoDiagnosisReader:
    """:class:`DiagnosisReader` over the jobs, control and ledger tables."""

    def __init__(self, client, names: TableNames, *, max_attempts: int = 2000) -> None:
        self.client = client
        self.names = names
        self.max_attempts = max_attempts
        self.truncated = False

    def _get(self, pk: str, sk: str, **projection: Any) -> dict[str, Any] | None:
        resp = self.client.get_item(TableName=self.names.jobs, Key=marshal({"pk": pk, "sk": sk}), **projection)
        return unmarshal(resp.get("Item"))

    def _pending_since(self, job_id: str, placed: float) -> float | None:
        """When the job last became PENDING before ``placed`` (its timeline's status events)."""
        events = paginate(self.client.query, TableName=self.names.jobs,
                          KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
                          ExpressionAttributeValues=marshal({":pk": job_pk(job_id), ":lo": EVENT_PREFIX,
                                                             ":hi": f"{EVENT_PREFIX}{iso(placed)}~"}),
                          **EVENT_PROJECTION)
        last = None
        for e in events:
            at = _ts(e.get("ts"))
            if e.get("kind") == "status" and (e.get("detail") or {}).get("to") == "PENDING" and at is not None \
                    and at <= placed:
                last = at
        return last

    def window(self, since: float, until: float, pool: str | None = None) -> Inputs:
        with translate_errors():
            directory = {part: query_directory(self.client, self.names.control, part)
                         for part in (DIR_NODES, DIR_ALLOCATIONS)}
            directory[DIR_TENANTS] = list(paginate(  # the tenants' keys only: never their webhook secrets
                self.client.query, TableName=self.names.control, IndexName=DIRECTORY_INDEX,
                KeyConditionExpression="#d = :d", ProjectionExpression="pk, sk",
                ExpressionAttributeNames={"#d": DIRECTORY_ATTR}, ExpressionAttributeValues={":d": {"S": DIR_TENANTS}}))
            pending_items = [it for it in query_pending(self.client, self.names.jobs, None)
                             if it.get("status") == "PENDING"]
        nodes = tuple(NodeInventory(it["node_id"], str(it.get("pool", "")), len(it.get("gpus") or []),
                                    bool(it.get("draining", False)))
                      for it in directory[DIR_NODES] if it.get("sk") == NODE_SK and it.get("node_id")
                      and (pool is None or it.get("pool") == pool))
        held: dict[tuple[str, int], None] = {}
        tenants = {it["pk"][len(TENANT_PREFIX):] for it in directory[DIR_TENANTS] if it.get("sk") == TENANT_SK}
        for it in directory[DIR_ALLOCATIONS]:
            if str(it.get("pk", "")).startswith(ALLOC_PREFIX) and it.get("job_id") and it.get("node"):
                held[(it["job_id"], int(it["epoch"]))] = None
                tenants.add(str(it.get("owner_path", "")).split("/")[0])
        tenants |= {str(it.get("tenant")) for it in pending_items if it.get("tenant")}
        ended: dict[tuple[str, int], float] = {}
        with translate_errors():
            for tenant in sorted(t for t in tenants if t):
                for e in ledger.tenant_entries(self.client, self.names.ledger, tenant, iso(since)):
                    at = _ts(e.get("at"))
                    key = (str(e.get("job_id")), int(e.get("epoch") or 0))
                    if at is not None and key not in held:
                        ended[key] = max(at, ended.get(key, 0.0))
        keys = list(held) + sorted(ended, key=lambda k: -ended[k])
        self.truncated = len(keys) > self.max_attempts
        node_ids = {n.node_id for n in nodes}
        bookings: list[Booking] = []
        pending: list[PendingInterval] = []
        jobs: dict[str, dict[str, Any] | None] = {}
        with translate_errors():
            for job_id, epoch in keys[: self.max_attempts]:
                attempt = self._get(job_pk(job_id), attempt_sk(epoch))
                placed = _ts((attempt or {}).get("created_at"))
                if attempt is None or placed is None or placed >= until:
                    continue
                end = ended.get((job_id, epoch))
                members = [m for m in ((attempt.get("charge") or {}).get("members") or [])
                           if m.get("node") in node_ids]
                for m in members:
                    bookings.append(Booking.with_marks(
                        attempt_marks(attempt), job_id=job_id, epoch=epoch, node_id=m["node"],
                        gpus=tuple(int(g) for g in m.get("gpu_indices") or ()), start=placed, end=end))
                if members and job_id not in jobs:
                    jobs[job_id] = self._get(job_pk(job_id), JOB_META, ProjectionExpression=JOB_PROJECTION,
                                             ExpressionAttributeNames=JOB_NAMES)
                job = jobs.get(job_id) or {}
                waited = self._pending_since(job_id, placed) if members else None
                if waited is not None and waited < placed:
                    gpus = int(((job.get("spec") or {}).get("resources") or {}).get("gpus") or 1)
                    current = int(job.get("current_epoch") or 0) == epoch
                    pending.append(PendingInterval(job_id, waited, placed, max(1, gpus),
                                                   tuple((job.get("spec") or {}).get("pools") or ()),
                                                   str(job.get("sched_reason") or "") if current else ""))
        for it in pending_items:
            try:
                job = job_from_item(it)
            except (ValueError, KeyError, TypeError):
                continue
            pending.append(PendingInterval(job.job_id, job.pending_since, None, max(1, job.num_gpu), job.pools,
                                           job.wait_reason, job.nodes))
        return Inputs(since, until, nodes, tuple(bookings), tuple(pending))

