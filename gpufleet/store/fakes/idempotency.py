"""In-memory :class:`~gpufleet.store.idempotency.IdempotencyStore`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.clock import Clock
from gpufleet.errors import IdempotencyInFlight
from gpufleet.store import idempotency as idem
from gpufleet.store.fakes.memory import MemoryDatabase, MemoryWrite
from gpufleet.tables import idempotency_pk


@dataclass
class MemoryIdempotencyStore:
    db: MemoryDatabase
    clock: Clock
    table: str = "control"
    poll_s: float = 0.01

    def _key(self, tenant: str, key: str) -> tuple[str, str]:
        return (idempotency_pk(tenant, key), idem.SK)

    def get_record(self, tenant: str, key: str) -> dict[str, Any] | None:
        return self.db.get(self.table, self._key(tenant, key))

    def begin(self, tenant: str, key: str, payload_hash: str, *, wait_s: float = 2.0) -> idem.Claim | idem.Replay:
        def try_claim(item: dict[str, Any]) -> bool:
            with self.db.lock:
                if not idem.claimable(self.get_record(tenant, key), item["created_at"]):
                    return False
                self.db.put(self.table, item)
                return True

        return idem.claim_or_wait(
            try_claim,
            lambda: self.get_record(tenant, key),
            lambda now: idem.new_record(
                tenant, key, payload_hash, now, ttl_s=idem.TTL_SECONDS, in_flight_s=idem.IN_FLIGHT_SECONDS
            ),
            payload_hash,
            self.clock,
            wait_s=wait_s,
            poll_s=self.poll_s,
        )

    def _owned(self, claim: idem.Claim) -> bool:
        rec = self.get_record(claim.tenant, claim.key)
        return rec is not None and rec.get("state") == idem.IN_PROGRESS and rec.get("token") == claim.token

    def completion(
        self, claim: idem.Claim, status: int, headers: dict[str, str], body: str, job_id: str | None
    ) -> MemoryWrite:
        def apply() -> None:
            rec = self.get_record(claim.tenant, claim.key) or {}
            rec.pop("in_flight_until", None)
            rec.update(state=idem.COMPLETED, response={"status": status, "headers": dict(headers), "body": body},
                       job_id=job_id or "")
            self.db.put(self.table, rec)

        return MemoryWrite(
            check=lambda: self._owned(claim),
            apply=apply,
            error=lambda: IdempotencyInFlight("the request lost its claim on the Idempotency-Key; retry"),
        )

    def abandon(self, claim: idem.Claim) -> None:
        with self.db.lock:
            if self._owned(claim):
                self.db.delete(self.table, self._key(claim.tenant, claim.key))
