"""In-memory :class:`~gpufleet.store.ratelimit.RateLimitStore`."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.ratelimit import decide
from gpufleet.tables import RATE_SK, rate_pk


@dataclass
class MemoryRateLimitStore:
    """The same GCRA decisions as the DynamoDB store, on a ``RATE#<tenant>`` item under the database lock."""

    db: MemoryDatabase
    table: str = "control"

    def take(self, tenant: str, *, rate: float, burst: int, now: float) -> float:
        key = (rate_pk(tenant), RATE_SK)
        with self.db.lock:
            item = self.db.get(self.table, key)
            allowed, new, wait = decide(item.get("tat") if item else None, now, rate, burst)
            if not allowed:
                return max(wait, 1e-3)
            self.db.put(self.table, {"pk": key[0], "sk": key[1], "tat": new})
            return 0.0
