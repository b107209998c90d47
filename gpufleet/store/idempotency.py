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
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock
from gpufleet.errors import IdempotencyInFlight, IdempotencyMismatch
from gpufleet.store.dynamo import error_code, marshal, marshal_value, unmarshal
from gpufleet.tables import idempotency_pk

SK = "IDEMP"
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
    return unmarshal(client.get_item(TableName=table, Key=_key(tenant, key), ConsistentRead=True).get("Item"))


def _decide(rec: dict[str, Any], payload_hash: str, now: float) -> Replay | None:
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


def begin(
    client,
    table: str,
    tenant: str,
    key: str,
    payload_hash: str,
    *,
    clock: Clock | None = None,
    wait_s: float = 2.0,
    poll_s: float = 0.05,
    ttl_s: int = TTL_SECONDS,
    in_flight_s: int = IN_FLIGHT_SECONDS,
) -> Claim | Replay:
    """Claim ``key`` for this request, or return the replay of the request that owns it (see module doc)."""
    clock = clock or SystemClock()
    deadline = time.monotonic() + wait_s
    while True:
        now = clock.now()
        token = secrets.token_hex(16)
        item = {
            "pk": idempotency_pk(tenant, key),
            "sk": SK,
            "tenant": tenant,
            "idempotency_key": key,
            "state": IN_PROGRESS,
            "payload_hash": payload_hash,
            "token": token,
            "created_at": int(now),
            "in_flight_until": int(now) + in_flight_s,
            "expires_at": int(now) + ttl_s,
        }
        try:
            client.put_item(
                TableName=table,
                Item=marshal(item),
                ConditionExpression=(
                    "attribute_not_exists(pk) OR expires_at < :now OR (#st = :ip AND in_flight_until < :now)"
                ),
                ExpressionAttributeNames={"#st": "state"},
                ExpressionAttributeValues={":now": marshal_value(int(now)), ":ip": marshal_value(IN_PROGRESS)},
            )
            return Claim(tenant=tenant, key=key, token=token, payload_hash=payload_hash)
        except ClientError as err:
            if error_code(err) != "ConditionalCheckFailedException":
                raise
        # Someone holds the key: wait for it to complete (same payload) or give up.
        while True:
            rec = get_record(client, table, tenant, key)
            if rec is None:
                break  # the owner abandoned it: try to claim again
            replay = _decide(rec, payload_hash, clock.now())
            if replay is not None:
                return replay
            if int(rec.get("in_flight_until", 0)) < clock.now():
                break  # the owner died: take over
            if time.monotonic() >= deadline:
                raise IdempotencyInFlight("a request with this Idempotency-Key is still being processed; retry shortly")
            time.sleep(poll_s)


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
            raise
