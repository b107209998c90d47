"""In-memory :class:`~gpufleet.store.diagnosis.DiagnosisReader` over the fakes' shared database.

It makes the DynamoDB reader's reads (:class:`~gpufleet.store.diagnosis.WindowReads`) against the same items — the
directory partitions (``gsi2pk``), the PENDING jobs (gsi3, as :class:`~gpufleet.store.fakes.snapshot.MemorySnapshotReader`
reads them), a tenant's ledger entries (``gsi1pk`` / ``gsi1sk`` from ``since``), a job's attempt and event items
(the events and the job item cut to the same projections) — and assembles them with the DynamoDB reader's own
:func:`~gpufleet.store.diagnosis.read_window`.
"""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.clock import iso
from gpufleet.diagnose.attribution import Inputs
from gpufleet.store.diagnosis import EVENT_PROJECTION, JOB_NAMES, JOB_PROJECTION, read_window
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.snapshot import MemorySnapshotReader, project
from gpufleet.tables import (
    DIR_TENANTS,
    DIRECTORY_ATTR,
    EVENT_PREFIX,
    JOB_META,
    attempt_sk,
    job_pk,
    tenant_list_pk,
)


def _paths(expression: str, names: dict[str, str]) -> tuple[str, ...]:
    """A ProjectionExpression's attribute paths with its ``#names`` resolved (``#s.#res`` -> ``spec.resources``)."""
    return tuple(".".join(names.get(p, p) for p in path.strip().split(".")) for path in expression.split(","))


EVENT_PATHS = _paths(EVENT_PROJECTION["ProjectionExpression"], EVENT_PROJECTION["ExpressionAttributeNames"])
JOB_PATHS = _paths(JOB_PROJECTION, JOB_NAMES)


class MemoryDiagnosisReader:
    def __init__(
        self,
        db: MemoryDatabase,
        *,
        jobs_table: str = "jobs",
        control_table: str = "control",
        ledger_table: str = "ledger",
        max_jobs: int = 2000,
    ) -> None:
        self.db = db
        self.jobs_table, self.control_table, self.ledger_table = jobs_table, control_table, ledger_table
        self.max_jobs = max_jobs
        self.truncated = False
        self.node_items: list[dict[str, Any]] = []
        self._snapshot = MemorySnapshotReader(db, jobs_table, control_table)

    def _where(self, table: str, keep) -> list[dict[str, Any]]:
        with self.db.lock:
            return copy.deepcopy([it for it in self.db.table(table).values() if keep(it)])

    def _between(self, job_id: str, lo: str, hi: str) -> list[dict[str, Any]]:
        pk = job_pk(job_id)
        return sorted(
            self._where(self.jobs_table, lambda it: it["pk"] == pk and lo <= it["sk"] <= hi), key=lambda it: it["sk"]
        )

    def directory(self, part: str) -> list[dict[str, Any]]:
        return self._where(self.control_table, lambda it: it.get(DIRECTORY_ATTR) == part)

    def tenant_keys(self) -> list[dict[str, Any]]:
        return [{"pk": it["pk"], "sk": it["sk"]} for it in self.directory(DIR_TENANTS)]

    def pending(self) -> list[dict[str, Any]]:
        return self._snapshot.pending(None)

    def tenant_entries(self, tenant: str, since: str) -> list[dict[str, Any]]:
        hk = tenant_list_pk(tenant)
        rows = self._where(self.ledger_table, lambda it: it.get("gsi1pk") == hk and str(it.get("gsi1sk")) >= since)
        return sorted(rows, key=lambda it: str(it["gsi1sk"]))

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return self._between(job_id, attempt_sk(0), attempt_sk(99_999_999))

    def events(self, job_id: str, until: float) -> list[dict[str, Any]]:
        return [project(it, EVENT_PATHS) for it in self._between(job_id, EVENT_PREFIX, f"{EVENT_PREFIX}{iso(until)}~")]

    def job(self, job_id: str) -> dict[str, Any]:
        item = self.db.get(self.jobs_table, (job_pk(job_id), JOB_META))
        return project(item, JOB_PATHS) if item else {}

    def window(self, since: float, until: float, pool: str | None = None) -> Inputs:
        got = read_window(self, since, until, pool, self.max_jobs)
        self.truncated, self.node_items = got.truncated, got.node_items
        return got.inputs
