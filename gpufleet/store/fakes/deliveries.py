"""In-memory :class:`~gpufleet.store.deliveries.DeliveryStore`: delivery tries and event claims on the job's
partition, with the DynamoDB store's conditions (a try is written once; a claim succeeds for a new event, its
own owner, or an expired lease, never once delivered; marking a missing claim delivered changes nothing)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.tables import DELIVERY_PREFIX, delivery_claim_sk, delivery_sk, job_pk


@dataclass
class MemoryDeliveryStore:
    db: MemoryDatabase
    jobs_table: str = "jobs"

    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None:
        item = stored({"pk": job_pk(job_id), "sk": delivery_sk(at, msg_id, attempt), **fields})
        with self.db.lock:
            if self.db.get(self.jobs_table, (item["pk"], item["sk"])) is None:
                self.db.put(self.jobs_table, item)

    def claim(self, job_id: str, msg_id: str, owner: str, now: float, lease_s: float) -> bool:
        key = (job_pk(job_id), delivery_claim_sk(msg_id))
        with self.db.lock:
            item = self.db.get(self.jobs_table, key)
            if item is not None and ("delivered_at" in item or (item.get("claimed_by") != owner
                                                                and not (item.get("claim_until") is not None
                                                                         and item["claim_until"] < now))):
                return False
            item = item or {"pk": key[0], "sk": key[1]}
            item.update(msg_id=msg_id, claimed_by=owner, claimed_at=float(now), claim_until=float(now + lease_s))
            self.db.put(self.jobs_table, stored(item))
            return True

    def mark_delivered(self, job_id: str, msg_id: str, now: float) -> None:
        key = (job_pk(job_id), delivery_claim_sk(msg_id))
        with self.db.lock:
            item = self.db.get(self.jobs_table, key)
            if item is not None:
                item["delivered_at"] = float(now)
                self.db.put(self.jobs_table, stored(item))

    def list(self, job_id: str) -> list[dict[str, Any]]:
        pk = job_pk(job_id)
        with self.db.lock:
            rows = [it for (p, s), it in self.db.table(self.jobs_table).items()
                    if p == pk and s.startswith(DELIVERY_PREFIX)]
            return copy.deepcopy(sorted(rows, key=lambda it: it["sk"]))
