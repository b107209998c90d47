"""What GPU-time attribution needs for a window, read from the tables (:mod:`gpufleet.diagnose.attribution`).

Contract: :meth:`DiagnosisReader.window` returns frozen
:class:`~gpufleet.diagnose.attribution.Inputs` for ``[since, until)`` and an optional pool, from:
- the nodes: the control table's ``DIR#NODES`` liveness items (pool, GPU count, ``draining``), as the
  scheduler's snapshot reads them (:func:`gpufleet.store.snapshot.query_directory`);
- the jobs whose attempts may have booked GPUs in the window: those holding GPUs now (``DIR#ALLOCATIONS``),
  those billed since ``since`` (each tenant's ledger entries, :func:`gpufleet.store.ledger.tenant_entries`;
  tenants: ``DIR#TENANTS``, keys only, plus the owners of allocations and PENDING jobs) and PENDING jobs
  with earlier attempts. Per job: its attempt items (one Query), its timeline's events (one Query, projected
  to ``ts``, ``kind``, ``detail.to``, ``detail.epoch``) and its item (projected: current epoch,
  ``sched_reason``, the spec's GPUs and pools; never the prompt);
- a booking per attempt member on a known node (``charge.members``: node, GPU indices), from ``created_at``
  (placed) to: nothing while it holds GPUs; else its ledger entry's ``at`` (the job's billed attempt), else its
  ``attempt_failed`` event, else the next attempt's placement (an end not recorded at all: left out); its
  phase marks from :func:`gpufleet.phases.attempt_marks`. Cloud attempts (no node) are left out: a cloud
  pool has no idle capacity to lose;
- the PENDING intervals: jobs PENDING now (index gsi3: ``pending_since`` to now, the recorded
  ``sched_reason``), and each attempt's wait from the job's last ``status`` event to PENDING before it was
  placed, with the job's last ``sched_reason`` for its current attempt (an earlier one's reason is not kept).
At most ``max_jobs`` jobs are read (the most recent first); :attr:`DynamoDiagnosisReader.truncated` says
when the cap cut some, and :attr:`DynamoDiagnosisReader.node_items` keeps the liveness items the window read (of
``pool`` when given) for :func:`gpufleet.diagnose.fleet.fleet_view`. Reads only (Query, GetItem); AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.clock import epoch_seconds, iso
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
EVENT_PROJECTION = {"ProjectionExpression": "#t, #k, #d.#to, #d.#e",
                    "ExpressionAttributeNames": {"#t": "ts", "#k": "kind", "#d": "detail", "#to": "to", "#e": "epoch"}}


class DiagnosisReader(Protocol):
    def window(self, since: float, until: float, pool: str | None = None) -> Inputs: ...


def _attempts(marks_of: list[dict[str, Any]], events: list[dict[str, Any]], held: set[int], billed: dict[int, float],
              node_ids: set[str], job: dict[str, Any], until: float) -> tuple[list[Booking], list[PendingInterval]]:
    """One job's bookings and waits from its attempt items, its timeline and what holds or billed it (pure)."""
    pend_at = sorted(t for e in events if e.get("kind") == "status" and (e.get("detail") or {}).get("to") == "PENDING"
                     and (t := epoch_seconds(e.get("ts"))) is not None)
    failed: dict[int, float] = {}
    for e in events:
        d = e.get("detail") or {}
        if e.get("kind") == "attempt_failed" and d.get("epoch") is not None and (t := epoch_seconds(e.get("ts"))) is not None:
            failed.setdefault(int(d["epoch"]), t)
    attempts = sorted(((int(a.get("epoch") or 0), a) for a in marks_of), key=lambda x: x[0])
    placed_at = {e: epoch_seconds(a.get("created_at")) for e, a in attempts}
    spec = job.get("spec") or {}
    gpus = max(1, int((spec.get("resources") or {}).get("gpus") or 1))
    bookings, waits = [], []
    for i, (epoch, attempt) in enumerate(attempts):
        placed = placed_at[epoch]
        if placed is None or placed >= until:
            continue
        later = [t for e, _ in attempts[i + 1:] if (t := placed_at[e]) is not None]
        end = None if epoch in held else billed.get(epoch, failed.get(epoch, later[0] if later else None))
        if end is None and epoch not in held:
            continue  # ended, but when is not recorded: left out
        members = [m for m in ((attempt.get("charge") or {}).get("members") or []) if m.get("node") in node_ids]
        for m in members:
            bookings.append(Booking.with_marks(attempt_marks(attempt), job_id=str(attempt.get("job_id")), epoch=epoch,
                                               node_id=m["node"], gpus=tuple(int(g) for g in m.get("gpu_indices") or ()),
                                               start=placed, end=end))
        since = max((t for t in pend_at if t <= placed), default=None)
        if since is not None and since < placed:
            current = int(job.get("current_epoch") or 0) == epoch
            waits.append(PendingInterval(str(attempt.get("job_id")), since, placed, gpus, tuple(spec.get("pools") or ()),
                                         str(job.get("sched_reason") or "") if current else ""))
    return bookings, waits


class WindowReads(Protocol):
    """The reads one window takes; :func:`read_window` assembles them (each backend reads its own way)."""

    def directory(self, part: str) -> list[dict[str, Any]]:
        """The control items listed under directory partition ``part``."""
        ...

    def tenant_keys(self) -> list[dict[str, Any]]:
        """The ``DIR#TENANTS`` items, keys only (never a webhook secret)."""
        ...

    def pending(self) -> list[dict[str, Any]]:
        """The PENDING job items (index gsi3, as the scheduler's snapshot reads them)."""
        ...

    def tenant_entries(self, tenant: str, since: str) -> list[dict[str, Any]]:
        """The tenant's ledger entries recorded since ``since`` (ISO 8601)."""
        ...

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        """The job's attempt items."""
        ...

    def events(self, job_id: str, until: float) -> list[dict[str, Any]]:
        """The job's timeline up to ``until``, projected to :data:`EVENT_PROJECTION`."""
        ...

    def job(self, job_id: str) -> dict[str, Any]:
        """The job item projected to :data:`JOB_PROJECTION` (empty when missing)."""
        ...


@dataclass(frozen=True)
class Window:
    inputs: Inputs
    #: the ``max_jobs`` cap cut some jobs
    truncated: bool
    #: the nodes' liveness items the window read (of its pool when given)
    node_items: list[dict[str, Any]]


def read_window(reads: WindowReads, since: float, until: float, pool: str | None, max_jobs: int) -> Window:
    """The attribution inputs of ``[since, until)`` from ``reads`` (the module contract)."""
    directory = {part: reads.directory(part) for part in (DIR_NODES, DIR_ALLOCATIONS)}
    pending_items = [it for it in reads.pending() if it.get("status") == "PENDING"]
    node_items = [it for it in directory[DIR_NODES] if it.get("sk") == NODE_SK and it.get("node_id")
                  and (pool is None or it.get("pool") == pool)]
    nodes = tuple(NodeInventory(it["node_id"], str(it.get("pool", "")), len(it.get("gpus") or []),
                                bool(it.get("draining", False))) for it in node_items)
    held: dict[str, set[int]] = defaultdict(set)
    billed: dict[str, dict[int, float]] = defaultdict(dict)
    recent: dict[str, float] = {}  # job id -> how recently it touched the window (newest read first)
    tenants = {it["pk"][len(TENANT_PREFIX):] for it in reads.tenant_keys() if it.get("sk") == TENANT_SK}
    for it in directory[DIR_ALLOCATIONS]:
        if str(it.get("pk", "")).startswith(ALLOC_PREFIX) and it.get("job_id") and it.get("node"):
            held[it["job_id"]].add(int(it["epoch"]))
            recent[it["job_id"]] = until
            tenants.add(str(it.get("owner_path", "")).split("/")[0])
    for it in pending_items:
        tenants.add(str(it.get("tenant") or ""))
        if int(it.get("attempt_count") or 0) > 0:  # waiting again: its earlier attempts may be in the window
            recent[it["job_id"]] = until
    for tenant in sorted(t for t in tenants if t):
        for e in reads.tenant_entries(tenant, iso(since)):
            at = epoch_seconds(e.get("at"))
            if at is not None and e.get("job_id"):
                billed[e["job_id"]][int(e.get("epoch") or 0)] = at
                recent[e["job_id"]] = max(recent.get(e["job_id"], 0.0), at)
    order = sorted(recent, key=lambda j: (-recent[j], j))
    node_ids = {n.node_id for n in nodes}
    bookings: list[Booking] = []
    pending: list[PendingInterval] = []
    for job_id in order[:max_jobs]:
        b, w = _attempts(reads.attempts(job_id), reads.events(job_id, until), held.get(job_id, set()),
                         billed.get(job_id, {}), node_ids, reads.job(job_id), until)
        bookings += b
        pending += w
    for it in pending_items:
        try:
            job = job_from_item(it)
        except (ValueError, KeyError, TypeError):
            continue
        pending.append(PendingInterval(job.job_id, job.pending_since, None, max(1, job.num_gpu), job.pools,
                                       job.wait_reason, job.nodes))
    return Window(Inputs(since, until, nodes, tuple(bookings), tuple(pending)), len(order) > max_jobs, node_items)


class DynamoDiagnosisReader:
    """:class:`DiagnosisReader` over the jobs, control and ledger tables (its :class:`WindowReads` are
    Query and GetItem calls)."""

    def __init__(self, client, names: TableNames, *, max_jobs: int = 2000) -> None:
        self.client = client
        self.names = names
        self.max_jobs = max_jobs
        self.truncated = False
        #: the nodes' liveness items the last window read (of its pool when given)
        self.node_items: list[dict[str, Any]] = []

    def _query(self, job_id: str, lo: str, hi: str, **kw: Any) -> list[dict[str, Any]]:
        with translate_errors():
            return list(paginate(self.client.query, TableName=self.names.jobs,
                                 KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
                                 ExpressionAttributeValues=marshal({":pk": job_pk(job_id), ":lo": lo, ":hi": hi}),
                                 **kw))

    def directory(self, part: str) -> list[dict[str, Any]]:
        with translate_errors():
            return query_directory(self.client, self.names.control, part)

    def tenant_keys(self) -> list[dict[str, Any]]:
        with translate_errors():
            return list(paginate(
                self.client.query, TableName=self.names.control, IndexName=DIRECTORY_INDEX,
                KeyConditionExpression="#d = :d", ProjectionExpression="pk, sk",
                ExpressionAttributeNames={"#d": DIRECTORY_ATTR}, ExpressionAttributeValues={":d": {"S": DIR_TENANTS}}))

    def pending(self) -> list[dict[str, Any]]:
        with translate_errors():
            return query_pending(self.client, self.names.jobs, None)

    def tenant_entries(self, tenant: str, since: str) -> list[dict[str, Any]]:
        return ledger.tenant_entries(self.client, self.names.ledger, tenant, since)

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return self._query(job_id, attempt_sk(0), attempt_sk(99_999_999))

    def events(self, job_id: str, until: float) -> list[dict[str, Any]]:
        return self._query(job_id, EVENT_PREFIX, f"{EVENT_PREFIX}{iso(until)}~", **EVENT_PROJECTION)

    def job(self, job_id: str) -> dict[str, Any]:
        with translate_errors():
            resp = self.client.get_item(TableName=self.names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}),
                                        ProjectionExpression=JOB_PROJECTION, ExpressionAttributeNames=JOB_NAMES)
        return unmarshal(resp.get("Item")) or {}

    def window(self, since: float, until: float, pool: str | None = None) -> Inputs:
        got = read_window(self, since, until, pool, self.max_jobs)
        self.truncated, self.node_items = got.truncated, got.node_items
        return got.inputs
