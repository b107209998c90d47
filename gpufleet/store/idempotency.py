"""Idempotency records for ``POST /v1/jobs`` (control table, ``IDEMP#<tenant>#<key>`` / ``IDEMP``).

Contract (scoped per tenant; a key lives 24 h, ``expires_at`` is the table's TTL attribute):

1. :func:`begin` claims the key with a conditional put of an ``IN_PROGRESS``
   record carrying the payload hash and an owner token. It succeeds when the
   key is new, expired (``expires_at`` passed — DynamoDB TTL deletes lazily, so
   the condition checks it too) or held by an in-flight request that died
   (``in_flight_until`` passed).
   Otherwise the existing record decides:
   - different payload hash → :class:`IdempotencyMismatch` (422);
   - ``COMPLETED`` → :class:`Replay` with the stored response;
   - ``IN_PROGRESS`` with the same payload → wait up to ``wait_s`` for it to
     complete (then replay), else :class:`IdempotencyInFlight` (409).
2. The owner finishes with :func:`completion_item`, a ``TransactWriteItems``
   Update that stores the response; it is written in the *same transaction*
   as the job, conditioned on the record still being this owner's.
3. An owner that fails before committing calls :func:`abandon` so the key can
   be retried (errors are not cached).

:class:`IdempotencyStore` is the Protocol the API service uses; :class:`DynamoIdempotencyStore`
implements it on the control table and :class:`gpufleet.store.fakes.idempotency.MemoryIdempotencyStore`
in memory. Both share the decision (:func:`decide`) and the wait loop (:func:`claim_or_wait`), and
one contract suite (``tests/functional/store/test_store_contract_idempotency.py``) runs on both.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.clock import Clock
from gpufleet.errors import IdempotencyInFlight, IdempotencyMismatch
from gpufleet.store.dynamo import error_code, marshal, marshal_value, reraise, translate_errors, unmarshal
from gpufleet.tables import IDEMPOTENCY_SK, idempotency_pk

SK = IDEMPOTENCY_SK
IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"
#: How long a key is remembered (documented in docs/api.md).
TTL_SECONDS = 24 * 3600
#: How long an IN_PROGRESS claim is honoured before another request may take over.
IN_FLIGHT_SECONDS = 60


@dataclass(frozen=True)
class Claim:
    """This request owns the key; finish with :func:`completion_item` or :func:`abandon`."""

    tenant: str
    key: str
    token: str
    payload_hash: str


@dataclass(frozen=True)
class Replay:
    """The key already completed with the same payload: return this response again."""

    status: int
    headers: dict[str, str]
    body: str
    job_id: str | None


def _key(tenant: str, key: str) -> dict[str, Any]:
    return marshal({"pk": idempotency_pk(tenant, key), "sk": SK})


def get_record(client, table: str, tenant: str, key: str) -> dict[str, Any] | None:
    with translate_errors():
        return unmarshal(client.get_item(TableName=table, Key=_key(tenant, key), ConsistentRead=True).get("Item"))


def decide(rec: dict[str, Any], payload_hash: str) -> Replay | None:
    """The existing record's verdict: a mismatch raises, a completed record replays, else None (in flight)."""
    if rec.get("payload_hash") != payload_hash:
        raise IdempotencyMismatch("this Idempotency-Key was used with a different payload")
    if rec.get("state") == COMPLETED:
        resp = rec["response"]
        return Replay(
            status=int(resp["status"]),
            headers=dict(resp.get("headers") or {}),
            body=resp["body"],
            job_id=rec.get("job_id"),
        )
    return None


def new_record(tenant: str, key: str, payload_hash: str, now: float, *, ttl_s: int, in_flight_s: int) -> dict[str, Any]:
    """A fresh ``IN_PROGRESS`` claim record (with a new owner token)."""
    return {
        "pk": idempotency_pk(tenant, key),
        "sk": SK,
        "tenant": tenant,
        "idempotency_key": key,
        "state": IN_PROGRESS,
        "payload_hash": payload_hash,
        "token": secrets.token_hex(16),
        "created_at": int(now),
        "in_flight_until": int(now) + in_flight_s,
        "expires_at": int(now) + ttl_s,
    }


def claimable(rec: dict[str, Any] | None, now: float) -> bool:
    """The claim condition: the key is new, expired, or held by an in-flight request that died."""
    if rec is None:
        return True
    if int(rec.get("expires_at", 0)) < int(now):
        return True
    return rec.get("state") == IN_PROGRESS and int(rec.get("in_flight_until", 0)) < int(now)


def claim_or_wait(
    try_claim: Callable[[dict[str, Any]], bool],
    read: Callable[[], dict[str, Any] | None],
    record: Callable[[float], dict[str, Any]],
    payload_hash: str,
    clock: Clock,
    *,
    wait_s: float,
    poll_s: float,
) -> Claim | Replay:
    """The claim protocol over a store's two primitives (see the module doc, step 1).

    ``try_claim(item)`` writes the claim record if :func:`claimable` holds (atomically) and says
    whether it did; ``read()`` returns the current record; ``record(now)`` builds a new claim.
    """
    deadline = time.monotonic() + wait_s
    while True:
        item = record(clock.now())
        if try_claim(item):
            return Claim(tenant=item["tenant"], key=item["idempotency_key"], token=item["token"], payload_hash=payload_hash)
        # Someone holds the key: wait for it to complete (same payload) or give up.
        while True:
            rec = read()
            if rec is None:
                break  # the owner abandoned it: try to claim again
            replay = decide(rec, payload_hash)
            if replay is not None:
                return replay
            if int(rec.get("in_flight_until", 0)) < clock.now():
                break  # the owner died: take over
            if time.monotonic() >= deadline:
                raise IdempotencyInFlight("a request with this Idempotency-Key is still being processed; retry shortly")
            time.sleep(poll_s)


def begin(
    client,
    table: str,
    tenant: str,
    key: str,
    payload_hash: str,
    *,
    clock: Clock,
    wait_s: float = 2.0,
    poll_s: float = 0.05,
    ttl_s: int = TTL_SECONDS,
    in_flight_s: int = IN_FLIGHT_SECONDS,
) -> Claim | Replay:
    """Claim ``key`` for this request, or return the replay of the request that owns it (see module doc)."""

    def try_claim(item: dict[str, Any]) -> bool:
        try:
            client.put_item(
                TableName=table,
                Item=marshal(item),
                ConditionExpression=(
                    "attribute_not_exists(pk) OR expires_at < :now OR (#st = :ip AND in_flight_until < :now)"
                ),
                ExpressionAttributeNames={"#st": "state"},
                ExpressionAttributeValues={":now": marshal_value(item["created_at"]), ":ip": marshal_value(IN_PROGRESS)},
            )
        except ClientError as err:
            if error_code(err) != "ConditionalCheckFailedException":
                reraise(err)
            return False
        return True

    return claim_or_wait(
        try_claim,
        lambda: get_record(client, table, tenant, key),
        lambda now: new_record(tenant, key, payload_hash, now, ttl_s=ttl_s, in_flight_s=in_flight_s),
        payload_hash,
        clock,
        wait_s=wait_s,
        poll_s=poll_s,
    )


def completion_item(
    table: str, claim: Claim, status: int, headers: dict[str, str], body: str, job_id: str | None
) -> dict[str, Any]:
    """The ``TransactWriteItems`` entry that marks the claim COMPLETED with its response."""
    return {
        "Update": {
            "TableName": table,
            "Key": _key(claim.tenant, claim.key),
            "UpdateExpression": "SET #st = :done, #resp = :resp, job_id = :job REMOVE in_flight_until",
            "ConditionExpression": "#st = :ip AND #tok = :tok",
            "ExpressionAttributeNames": {"#st": "state", "#resp": "response", "#tok": "token"},
            "ExpressionAttributeValues": {
                ":done": marshal_value(COMPLETED),
                ":ip": marshal_value(IN_PROGRESS),
                ":tok": marshal_value(claim.token),
                ":resp": marshal_value({"status": status, "headers": headers, "body": body}),
                ":job": marshal_value(job_id or ""),
            },
        }
    }


def abandon(client, table: str, claim: Claim) -> None:
    """Release a claim that will not complete (the request failed). No-op if it is no longer ours."""
    try:
        client.delete_item(
            TableName=table,
            Key=_key(claim.tenant, claim.key),
            ConditionExpression="#st = :ip AND #tok = :tok",
            ExpressionAttributeNames={"#st": "state", "#tok": "token"},
            ExpressionAttributeValues={":ip": marshal_value(IN_PROGRESS), ":tok": marshal_value(claim.token)},
        )
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            reraise(err)


class IdempotencyStore(Protocol):
    """Idempotency-Key records of one deployment (see the module doc for the protocol)."""

    def begin(self, tenant: str, key: str, payload_hash: str, *, wait_s: float = 2.0) -> Claim | Replay: ...

    def completion(
        self, claim: Claim, status: int, headers: dict[str, str], body: str, job_id: str | None
    ) -> Any:
        """The write that completes ``claim``; it joins the job's creation (``JobStore.create_job``'s
        ``extra_items``), so the job and the stored response land together or not at all."""
        ...

    def abandon(self, claim: Claim) -> None: ...

    def get_record(self, tenant: str, key: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class DynamoIdempotencyStore:
    """:class:`IdempotencyStore` on the control table."""

    client: Any
    table: str
    clock: Clock
    poll_s: float = 0.05

    def begin(self, tenant: str, key: str, payload_hash: str, *, wait_s: float = 2.0) -> Claim | Replay:
        return begin(self.client, self.table, tenant, key, payload_hash, clock=self.clock, wait_s=wait_s, poll_s=self.poll_s)

    def completion(
        self, claim: Claim, status: int, headers: dict[str, str], body: str, job_id: str | None
    ) -> dict[str, Any]:
        return completion_item(self.table, claim, status, headers, body, job_id)

    def abandon(self, claim: Claim) -> None:
        abandon(self.client, self.table, claim)

    def get_record(self, tenant: str, key: str) -> dict[str, Any] | None:
        return get_record(self.client, self.table, tenant, key)
