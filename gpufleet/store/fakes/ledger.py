"""In-memory :class:`~gpufleet.store.ledger.LedgerStore`: charges and waivers fenced on the job item.

Entries are built by the DynamoDB store's own builders (:func:`~gpufleet.store.ledger.entry`,
:func:`~gpufleet.store.ledger.waiver_entry`) and stored after the marshalling round trip. The job item
is the one :class:`~gpufleet.store.fakes.jobs.MemoryJobStore` keeps in the same database; the epoch
check, the job's ``billing`` and the entry land together under the database lock, as the DynamoDB
transaction does, with the same outcomes (``True`` written, ``False`` replay, StaleEpoch, NotFound).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import NotFound
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fencing import stale
from gpufleet.store.ledger import WAIVER_PREFIX, ChargeLike, entry, waiver_entry
from gpufleet.tables import JOB_META, job_pk


@dataclass
class MemoryLedgerStore:
    db: MemoryDatabase
    jobs_table: str = "jobs"
    ledger_table: str = "ledger"

    def _fenced_job(self, job_id: str, epoch: int, what: str = "") -> dict[str, Any]:
        """The job item if ``epoch`` is its current epoch (``#ce = :epoch``: a missing epoch never matches)."""
        item = self.db.get(self.jobs_table, (job_pk(job_id), JOB_META))
        if item is None:
            raise NotFound(f"job {job_id} not found")
        if "current_epoch" not in item or int(item["current_epoch"]) != epoch:
            raise stale(job_id, epoch, int(item.get("current_epoch", 0)), what)
        return item

    def record(self, job: dict[str, Any], epoch: int, charge: ChargeLike, *, pool: str | None, price: float,
               at: str) -> bool:
        if not charge.charged:
            raise ValueError("record() is for charged attempts; use record_waiver()")
        row = stored(entry(job, epoch, charge, pool, price, at))
        with self.db.lock:
            item = self._fenced_job(job["job_id"], epoch, "; billing refused")
            if self.db.get(self.ledger_table, (row["pk"], row["sk"])) is not None:
                return False  # a retried Bill task: already billed, nothing written
            item["billing"] = {**charge.as_item(), "epoch": epoch, "at": at}
            self.db.put(self.jobs_table, stored(item))
            self.db.put(self.ledger_table, row)
            return True

    def record_waiver(self, job_id: str, epoch: int, charge: ChargeLike, at: str, *,
                      job: dict[str, Any] | None = None, pool: str | None = None, price: float = 0.0) -> None:
        billing = {**charge.as_item(), "epoch": epoch, "at": at}
        with self.db.lock:
            if epoch > 0:
                item = self._fenced_job(job_id, epoch)
            else:
                item = self.db.get(self.jobs_table, (job_pk(job_id), JOB_META))
                if item is None:
                    raise NotFound(f"job {job_id} not found")
            item["billing"] = billing
            self.db.put(self.jobs_table, stored(item))
            if job is None:
                return
            row = stored(waiver_entry(job, epoch, charge, pool, price, at))
            if self.db.get(self.ledger_table, (row["pk"], row["sk"])) is None:  # written once
                self.db.put(self.ledger_table, row)

    def _items(self, job_id: str, prefix: str) -> list[dict[str, Any]]:
        pk = job_pk(job_id)
        with self.db.lock:
            rows = [it for (p, s), it in self.db.table(self.ledger_table).items() if p == pk and s.startswith(prefix)]
            return copy.deepcopy(sorted(rows, key=lambda it: it["sk"]))

    def entries(self, job_id: str) -> list[dict[str, Any]]:
        return self._items(job_id, "ATTEMPT#")

    def waivers(self, job_id: str) -> list[dict[str, Any]]:
        return self._items(job_id, WAIVER_PREFIX)
