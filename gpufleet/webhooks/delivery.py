"""Webhook delivery (I/O): queueing, signed HTTP POST, retries via SQS visibility, delivery log.

Contract:
- :func:`enqueue` puts one event on the webhook queue if the job subscribes to it (the
  Notify task and anyone emitting started/progress call it).
- :func:`deliver_message` is what the webhook sender Lambda runs per SQS record: it signs the
  body with the tenant's secret, POSTs it, and writes one ``DELIVERY#`` item on the job per
  try. On failure it sets the message's visibility to the next step of
  :data:`gpufleet.webhooks.events.RETRY_SCHEDULE_S` (attempt = ``ApproximateReceiveCount``)
  and reports the failure, so SQS redelivers it then; after the last step it leaves the
  message for the queue's redrive policy (``maxReceiveCount`` = schedule length + 1) to move
  it to the dead-letter queue.
- Per-tenant secrets live on the tenant item of the control table (``webhook_secret``);
  :func:`tenant_secret` creates one on first use with a conditional put.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock, iso
from gpufleet.store.dynamo import error_code, marshal, unmarshal
from gpufleet.tables import job_pk
from gpufleet.webhooks import events, signing

Poster = Callable[[str, dict[str, str], bytes, float], int]


def http_post(url: str, hdrs: dict[str, str], body: bytes, timeout_s: float) -> int:
    """POST ``body``; return the HTTP status (0 on a connection error). 2xx means delivered."""
    req = urllib.request.Request(url, data=body, headers=hdrs, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - URL validated by JobSpec
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return 0


def tenant_secret(ddb, control_table: str, tenant: str, *, create: bool = True) -> str:
    """The tenant's webhook secret; created (once, race-free) if missing and ``create``."""
    key = {"pk": {"S": f"TENANT#{tenant}"}, "sk": {"S": "TENANT"}}
    item = unmarshal(ddb.get_item(TableName=control_table, Key=key, ConsistentRead=True).get("Item")) or {}
    if item.get("webhook_secret"):
        return str(item["webhook_secret"])
    if not create:
        raise KeyError(f"tenant {tenant} has no webhook secret")
    secret = signing.new_secret()
    try:
        ddb.update_item(
            TableName=control_table,
            Key=key,
            UpdateExpression="SET webhook_secret = :s",
            ConditionExpression="attribute_not_exists(webhook_secret)",
            ExpressionAttributeValues={":s": {"S": secret}},
        )
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            raise
        return tenant_secret(ddb, control_table, tenant, create=False)
    return secret


def enqueue(sqs, queue_url: str, job: dict[str, Any], kind: str, *, clock: Clock | None = None,
            discriminator: str = "") -> str | None:
    """Queue the ``kind`` event of ``job`` if subscribed; return its message id (None if filtered out)."""
    clock = clock or SystemClock()
    event = events.build(job, kind, iso(clock.now()), discriminator)
    if not event["url"]:
        return None
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(event))
    return event["msg_id"]


@dataclass(frozen=True)
class Result:
    delivered: bool
    status_code: int
    attempt: int
    next_delay_s: int | None


def _log(ddb, jobs_table: str, event: dict[str, Any], result: Result, now: float) -> None:
    item = {
        "pk": job_pk(event["job_id"]),
        "sk": f"DELIVERY#{iso(now)}#{event['msg_id']}#{result.attempt:03d}",
        "msg_id": event["msg_id"],
        "event_type": f"job.{event['kind']}",
        "url": event["url"],
        "attempt": result.attempt,
        "status_code": result.status_code,
        "delivered": result.delivered,
        "at": iso(now),
        "next_retry_at": iso(now + result.next_delay_s) if result.next_delay_s is not None else None,
        "dead_lettered": (not result.delivered) and result.next_delay_s is None,
    }
    ddb.put_item(TableName=jobs_table, Item=marshal(item))


def deliver_message(
    body: str,
    receive_count: int,
    *,
    ddb,
    jobs_table: str,
    control_table: str,
    sqs=None,
    queue_url: str | None = None,
    receipt_handle: str | None = None,
    clock: Clock | None = None,
    post: Poster = http_post,
    timeout_s: float = 10.0,
) -> Result:
    """Deliver one queued event (one try). See the module contract for retry behaviour."""
    clock = clock or SystemClock()
    event = json.loads(body)
    secret = tenant_secret(ddb, control_table, event["tenant"])
    payload = event["body"].encode()
    now = clock.now()
    hdrs = signing.headers(secret, event["msg_id"], int(now), payload)
    status = post(event["url"], hdrs, payload, timeout_s)
    ok = 200 <= status < 300
    delay = None if ok else events.retry_delay(max(1, receive_count))
    result = Result(ok, status, max(1, receive_count), delay)
    _log(ddb, jobs_table, event, result, now)
    if not ok and delay is not None and sqs is not None and queue_url and receipt_handle:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=delay)
    return result


def list_deliveries(ddb, jobs_table: str, job_id: str) -> list[dict[str, Any]]:
    """The job's delivery log, oldest first (served by the API)."""
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": jobs_table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :d)",
        "ExpressionAttributeValues": {":pk": {"S": job_pk(job_id)}, ":d": {"S": "DELIVERY#"}},
    }
    while True:
        resp = ddb.query(**kwargs)
        out.extend(unmarshal(i) for i in resp.get("Items", []))
        if "LastEvaluatedKey" not in resp:
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def enqueue_changes(sqs, queue_url: str, changes: list[tuple[dict[str, Any] | None, dict[str, Any] | None]],
                    *, clock: Clock | None = None) -> list[str]:
    """Queue the ``started`` / ``progress`` events implied by job item changes (old, new images as plain
    dicts), filtered by each job's subscription. Returns the queued message ids."""
    queued = []
    for old, new in changes:
        for kind, disc in events.from_change(old, new):
            msg_id = enqueue(sqs, queue_url, new, kind, clock=clock, discriminator=disc)
            if msg_id:
                queued.append(msg_id)
    return queued
