"""In-memory :class:`~gpufleet.store.runs.RunStore`: the attempt item's task token and gang states, with the
DynamoDB store's conditions — the dispatch record fenced on the job's epoch (:class:`~gpufleet.errors.StaleEpoch`,
nothing written), each gang move only from the state before and never after ``gang_failed`` (refused: ``None`` /
``False``), a projection keeping only the named top-level attributes (and the key)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpufleet.clock import Clock
from gpufleet.errors import StaleEpoch
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.runs import (
    SUPERVISOR_CLAIMED_ATTR,
    SUPERVISOR_TOKEN_ATTR,
    cloud_dispatch_attributes,
    dispatch_attributes,
)
from gpufleet.tables import JOB_META, attempt_sk, job_pk


@dataclass
class MemoryRunStore:
    db: MemoryDatabase
    clock: Clock
    table: str = "jobs"

    def _get(self, key: tuple[str, str], fields: tuple[str, ...] | None) -> dict[str, Any] | None:
        item = self.db.get(self.table, key)
        if item is None or fields is None:
            return item
        return {k: v for k, v in item.items() if k in ("pk", *fields)}

    def job(self, job_id: str, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        return self._get((job_pk(job_id), JOB_META), fields)

    def attempt(self, job_id: str, epoch: int, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        return self._get((job_pk(job_id), attempt_sk(epoch)), fields)

    def record_dispatch(self, job_id: str, epoch: int, token: str, now: float,
                        inputs: tuple[str, ...] = (), members: tuple[str, ...] = ()) -> None:
        self._record(job_id, epoch, dispatch_attributes(token, now, inputs, members))

    def record_cloud_dispatch(self, job_id: str, epoch: int, token_sha256: str, now: float,
                              inputs: tuple[str, ...] = ()) -> None:
        self._record(job_id, epoch, cloud_dispatch_attributes(token_sha256, now, inputs))

    def claim_supervisor_token(self, job_id: str, epoch: int, token_sha256: str, now: float) -> bool:
        key = (job_pk(job_id), attempt_sk(epoch))
        with self.db.lock:
            item = self.db.get(self.table, key)
            if item is None or item.get(SUPERVISOR_TOKEN_ATTR) != token_sha256 or SUPERVISOR_CLAIMED_ATTR in item:
                return False
            self.db.put(self.table, stored({**item, SUPERVISOR_CLAIMED_ATTR: now}))
            return True

    def _record(self, job_id: str, epoch: int, attrs: dict[str, Any]) -> None:
        key = (job_pk(job_id), attempt_sk(epoch))
        with self.db.lock:
            job = self.db.get(self.table, (job_pk(job_id), JOB_META))
            if job is None or job.get("current_epoch") is None or int(job["current_epoch"]) != int(epoch):
                raise StaleEpoch(f"epoch {epoch} of {job_id} is stale")
            item = self.db.get(self.table, key) or {"pk": key[0], "sk": key[1]}
            self.db.put(self.table, stored({**item, **attrs}))

    def _move(self, job_id: str, epoch: int, node: str, want: str | None, to: str) -> dict[str, Any] | None:
        """``node``'s gang state ``want`` → ``to`` (``want`` None: any member) unless the gang failed; the item
        after, or ``None`` when refused. Under the database lock (a conditional update is atomic)."""
        key = (job_pk(job_id), attempt_sk(epoch))
        item = self.db.get(self.table, key)
        gang = (item or {}).get("gang") or {}
        if item is None or node not in gang or (want is not None and gang[node] != want) or "gang_failed" in item:
            return None
        gang[node] = to
        item["gang"] = gang
        return item

    def gang_ready(self, job_id: str, epoch: int, node: str, now: float) -> int | None:
        with self.db.lock:
            item = self._move(job_id, epoch, node, "dispatched", "ready")
            if item is None:
                return None
            item.setdefault("gang_beats", {})[node] = now
            item["gang_ready"] = int(item.get("gang_ready", 0)) + 1
            self.db.put(self.table, stored(item))
            return item["gang_ready"]

    def gang_beat(self, job_id: str, epoch: int, node: str, now: float) -> None:
        with self.db.lock:
            item = self.db.get(self.table, (job_pk(job_id), attempt_sk(epoch)))
            if item is None or node not in (item.get("gang") or {}):
                return
            item.setdefault("gang_beats", {})[node] = now
            self.db.put(self.table, stored(item))

    def gang_succeeded(self, job_id: str, epoch: int, node: str, gpu_seconds: float) -> tuple[int, float] | None:
        with self.db.lock:
            item = self._move(job_id, epoch, node, "ready", "succeeded")
            if item is None:
                return None
            item["gang_succeeded"] = int(item.get("gang_succeeded", 0)) + 1
            # DynamoDB adds numbers as decimals: so does the fake (a float sum could differ in the last digit)
            total = Decimal(str(item.get("gang_gpu_seconds", 0))) + Decimal(str(round(float(gpu_seconds), 3)))
            item["gang_gpu_seconds"] = float(total)
            self.db.put(self.table, stored(item))
            got = self.db.get(self.table, (job_pk(job_id), attempt_sk(epoch)))
            return int(got["gang_succeeded"]), float(got["gang_gpu_seconds"])

    def gang_fail(self, job_id: str, epoch: int, node: str, reason: str) -> bool:
        with self.db.lock:
            key = (job_pk(job_id), attempt_sk(epoch))
            item = self.db.get(self.table, key)
            if item is None or "gang_failed" in item:
                return False
            item["gang_failed"] = {"node": node, "reason": reason[:1000]}
            self.db.put(self.table, stored(item))
            return True
