"""The scheduler pass's lease: one item (``LEASE#scheduler`` / ``LEASE``, control table).

Contract: :meth:`Lease.acquire` is a conditional put that succeeds only if no unexpired lease
exists (``lease_until < now``); an expired lease is taken over. :meth:`Lease.release` deletes the
item only if ``owner`` still holds it (releasing another owner's lease does nothing). The item
carries ``expires_at`` (TTL attribute) so a lease left behind also disappears by itself.
AWS errors other than a failed condition become :mod:`gpufleet.errors` exceptions.

In-memory fake: :class:`gpufleet.store.fakes.lease.MemoryLease`; both are held to one contract suite
(``tests/functional/store/test_store_contract_lease.py``).
"""

from __future__ import annotations

from typing import Protocol

from gpufleet.errors import Conflict
from gpufleet.store.dynamo import marshal, translate_errors
from gpufleet.tables import LEASE_SK, SCHEDULER_LEASE_PK


class Lease(Protocol):
    def acquire(self, owner: str, now: float, ttl_s: float) -> bool: ...

    def release(self, owner: str) -> None: ...


class DynamoLease:
    """:class:`Lease` held as one conditional item of ``table`` (the scheduler's by default)."""

    def __init__(self, client, table: str, pk: str = SCHEDULER_LEASE_PK) -> None:
        self.client = client
        self.table = table
        self.key = {"pk": pk, "sk": LEASE_SK}

    def acquire(self, owner: str, now: float, ttl_s: float) -> bool:
        """True when ``owner`` now holds the lease until ``now + ttl_s``."""
        try:
            with translate_errors():
                self.client.put_item(
                    TableName=self.table,
                    Item=marshal({**self.key, "owner": owner, "expires_at": int(now + ttl_s), "lease_until": now + ttl_s}),
                    ConditionExpression="attribute_not_exists(pk) OR lease_until < :now",
                    ExpressionAttributeValues={":now": {"N": repr(float(now))}},
                )
        except Conflict:
            return False
        return True

    def release(self, owner: str) -> None:
        """Give the lease back if ``owner`` holds it; otherwise nothing happens."""
        try:
            with translate_errors():
                self.client.delete_item(
                    TableName=self.table,
                    Key=marshal(self.key),
                    ConditionExpression="#o = :o",
                    ExpressionAttributeNames={"#o": "owner"},
                    ExpressionAttributeValues={":o": {"S": owner}},
                )
        except Conflict:
            pass
