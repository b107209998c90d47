"""In-memory :class:`~gpufleet.store.lease.Lease`: the scheduler's one-pass lease, with the DynamoDB lease's
conditions (taken only when free or expired, ``lease_until < now``; given back only by its owner)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.tables import LEASE_SK, SCHEDULER_LEASE_PK


@dataclass
class MemoryLease:
    db: MemoryDatabase
    table: str = "control"
    pk: str = SCHEDULER_LEASE_PK

    def acquire(self, owner: str, now: float, ttl_s: float) -> bool:
        key = (self.pk, LEASE_SK)
        with self.db.lock:
            held = self.db.get(self.table, key)
            if held is not None and not held["lease_until"] < now:
                return False
            self.db.put(self.table, {"pk": key[0], "sk": key[1], "owner": owner, "expires_at": int(now + ttl_s),
                                     "lease_until": now + ttl_s})
            return True

    def release(self, owner: str) -> None:
        key = (self.pk, LEASE_SK)
        with self.db.lock:
            held = self.db.get(self.table, key)
            if held is not None and held.get("owner") == owner:
                self.db.delete(self.table, key)
