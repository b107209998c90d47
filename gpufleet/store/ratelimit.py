"""Per-tenant request rate buckets (control table, ``RATE#<tenant>`` / ``RATE``), shared by every API container.

Contract:
- A bucket is a token bucket of ``rate`` tokens per second holding at most
  ``burst`` tokens (full when unused), kept as GCRA: one number, the
  theoretical arrival time ``tat``. A request at ``now`` is allowed when
  ``max(tat, now) + 1/rate - now <= burst/rate``, and then moves ``tat`` to
  ``max(tat, now) + 1/rate``; a refused request changes nothing and is told how
  long until one would be allowed. ``burst`` requests at once are allowed on a
  full bucket, then one every ``1/rate`` seconds.
- :meth:`RateLimitStore.take` takes one token and returns 0.0, or the seconds
  to wait (> 0) without taking one.
- :class:`DynamoRateLimitStore` needs no read and no lock: an idle bucket is one
  conditional ``UpdateItem`` (``tat`` absent or past → ``now + 1/rate``); a busy
  one a second (``tat`` in the future and not too far → ``tat + 1/rate``), whose
  failure returns the old item and so the wait. Every write is atomic on the
  item, so containers running at once never over-spend a bucket. Each write
  refreshes ``expires_at`` (the table's TTL attribute) an hour past the point
  the bucket is full again, so idle buckets disappear.
- :class:`gpufleet.store.fakes.ratelimit.MemoryRateLimitStore` applies
  :func:`decide` under the fake database's lock, with the same results; one
  contract suite runs on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.store.dynamo import error_code, reraise
from gpufleet.tables import RATE_SK, rate_pk

#: An idle bucket's item lives this long after it is full again (TTL), so idle tenants cost nothing.
IDLE_TTL_S = 3600
#: A conditional write that lost a race (another container's request) is tried again this many times.
_TRIES = 4


class RateLimitStore(Protocol):
    def take(self, tenant: str, *, rate: float, burst: int, now: float) -> float:
        """Take one token from ``tenant``'s bucket: 0.0 if taken, else the seconds until one is available."""
        ...


def decide(tat: float | None, now: float, rate: float, burst: int) -> tuple[bool, float, float]:
    """GCRA step (see module doc) → (allowed, new tat, seconds to wait when refused)."""
    interval, tolerance = 1.0 / rate, burst / rate
    start = max(tat if tat is not None else now, now)
    new = start + interval
    if new - now <= tolerance + 1e-9:
        return True, new, 0.0
    return False, start, new - tolerance - now


def _n(x: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(round(x, 6))))}


@dataclass
class DynamoRateLimitStore:
    """:class:`RateLimitStore` on the control table (see module doc)."""

    client: Any
    table: str

    def _update(self, tenant: str, expr: str, cond: str, values: dict[str, Any], *, old: bool) -> dict[str, Any] | None:
        """Run one conditional update; None when it was applied, else the old item ({} when absent)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"pk": {"S": rate_pk(tenant)}, "sk": {"S": RATE_SK}},
            "UpdateExpression": expr,
            "ConditionExpression": cond,
            "ExpressionAttributeValues": values,
        }
        if old:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            self.client.update_item(**kwargs)
            return None
        except ClientError as err:
            if error_code(err) != "ConditionalCheckFailedException":
                reraise(err)
            return err.response.get("Item") or {}

    def take(self, tenant: str, *, rate: float, burst: int, now: float) -> float:
        interval, tolerance = 1.0 / rate, burst / rate
        expires = _n(math.ceil(now + tolerance + IDLE_TTL_S))
        wait = interval
        for _ in range(_TRIES):
            # An idle bucket (no item, or tat in the past): tat = now + 1/rate.
            if self._update(
                tenant,
                "SET tat = :new, expires_at = :exp",
                "attribute_not_exists(tat) OR tat <= :now",
                {":new": _n(now + interval), ":exp": expires, ":now": _n(now)},
                old=False,
            ) is None:
                return 0.0
            # A busy one: tat += 1/rate while the result stays within the burst.
            edge = now + tolerance - interval
            old = self._update(
                tenant,
                "SET tat = tat + :i, expires_at = :exp",
                "tat > :now AND tat <= :edge",
                {":i": _n(interval), ":exp": expires, ":now": _n(now), ":edge": _n(edge)},
                old=True,
            )
            if old is None:
                return 0.0
            tat = float(old["tat"]["N"]) if "tat" in old else None
            if tat is not None and tat > now:
                return max(tat - edge, 1e-3)
            wait = interval  # the bucket went idle between the two writes (another clock): try again
        return wait
