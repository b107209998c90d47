"""Webhook delivery (I/O): queueing, signed HTTP POST, retries via SQS visibility, delivery log.

Contract:
- :func:`queue_event` puts one event on the webhook queue once per target: the job's own
  ``spec.webhook`` if it subscribes to the kind, and every enabled endpoint of the job's tenant whose
  filter matches (:mod:`gpufleet.webhooks.endpoints`; the message carries ``endpoint_id`` and its own
  ``msg_id``, derived from the event's and the endpoint's ids). The Notify task and the jobs-stream
  consumer (started/progress) call it; :func:`enqueue` is the same returning one message id.
- An event is delivered once per (target, event) however often it is queued: before each try the message
  claims the event (:meth:`gpufleet.store.deliveries.DeliveryStore.claim`, a conditional update keyed by
  ``msg_id``, held until the try's retry delay plus :data:`CLAIM_MARGIN_S` have passed), and a success
  marks it delivered. A duplicate message (a retried Notify, a redelivered stream record) finds the event
  claimed or delivered and is dropped unsent (``Result.duplicate``); redeliveries of the claiming message
  itself are its retries; a dead-lettered chain redriven under a new message id may claim again once the
  lease ran out. A try is logged once per (message, attempt) (a conditional put).
- A message for an endpoint that was deleted or disabled meanwhile is dropped before any connection:
  logged with ``dead_lettered`` true and the reason, never retried (``Result.refused``).
- :func:`deliver_message` is what the webhook sender Lambda runs per SQS record: it signs the
  body with the tenant's secret, POSTs it, and writes one ``DELIVERY#`` item on the job per
  try. On failure it sets the message's visibility to the next step of
  :data:`gpufleet.webhooks.events.RETRY_SCHEDULE_S` (attempt = ``ApproximateReceiveCount``)
  and reports the failure, so SQS redelivers it then; after the last step it leaves the
  message for the queue's redrive policy (``maxReceiveCount`` = schedule length + 1) to move
  it to the dead-letter queue.
- Per-tenant secrets live KMS-encrypted on the tenant item (:mod:`gpufleet.store.webhook_keys`);
  :func:`signing_secrets` creates one on first use with a conditional update, and a delivery is
  signed with every secret live at that moment (:mod:`gpufleet.webhooks.keys`: during a rotation's
  overlap the current and the previous one). Every DynamoDB and SQS call
  goes through :mod:`gpufleet.store.deliveries` and :mod:`gpufleet.store.queues`.
- Before any connection the URL passes :mod:`gpufleet.webhooks.urlpolicy`: the syntactic check,
  then the host is resolved and EVERY address checked. A refusal is permanent: the try is logged
  with ``dead_lettered`` true and a ``reason``, no connection is made, no retry is scheduled
  (``Result.refused``; the sender Lambda drops the message instead of handing it back to SQS).
  A resolution failure is an ordinary failed try (status 0, retried).
- :func:`pinned_post` connects only to the checked addresses (DNS is not asked again, so a
  rebinding between check and connect cannot redirect it) while the TLS SNI, certificate check
  and ``Host`` header use the original hostname. Redirects are not followed: a 3xx is a failed try.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.clock import Clock, iso
from gpufleet.errors import NotFound, ValidationFailed
from gpufleet.ids import ulid
from gpufleet.jobrecord import JobRecord
from gpufleet.store.deliveries import DeliveryStore, DynamoDeliveryStore
from gpufleet.store.queues import SqsMessageQueue
from gpufleet.store.webhook_endpoints import WebhookEndpointStore
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox, WebhookKeyStore
from gpufleet.webhooks import endpoints as endpoint_rules
from gpufleet.webhooks import events, signing, urlpolicy
from gpufleet.webhooks import keys as webhook_keys
from gpufleet.webhooks.keys import WebhookKey
from gpufleet.webhooks.urlpolicy import IPAddress, Target

#: ``post(target, addresses, headers, body, timeout_s) -> HTTP status`` (0 = no response).
Poster = Callable[[Target, Sequence[IPAddress], dict[str, str], bytes, float], int]
#: How long past a try's retry delay its claim on the event holds (the sender's run and the queue's visibility).
CLAIM_MARGIN_S = 900
#: ``resolve(host, port) -> addresses`` as ``getaddrinfo`` reports them.
Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to for a TCP connection (unique, in resolver order)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _Pinned:
    """Mixin: open the TCP connection to the pinned, checked addresses instead of resolving
    ``self.host`` again. ``self.host`` stays the hostname, so http.client sends it as ``Host`` and
    (HTTPS) uses it for SNI and the certificate check. Overrides http.client's
    ``_create_connection`` hook, the one place it opens the socket."""

    def _pin(self, addrs: Sequence[IPAddress]) -> None:
        self._addrs = list(addrs)
        self._create_connection = self._connect_pinned

    def _connect_pinned(self, address: tuple[str, int], timeout: float | None, source_address=None) -> socket.socket:
        err: OSError | None = None
        for addr in self._addrs:  # like socket.create_connection, but only over the checked addresses
            try:
                return socket.create_connection((str(addr), address[1]), timeout, source_address)
            except OSError as exc:
                err = exc
        raise err or OSError("no address to connect to")


class _PinnedHTTP(_Pinned, http.client.HTTPConnection):
    pass


class _PinnedHTTPS(_Pinned, http.client.HTTPSConnection):
    pass


def pinned_post(target: Target, addrs: Sequence[IPAddress], hdrs: dict[str, str], body: bytes,
                timeout_s: float, *, context: ssl.SSLContext | None = None) -> int:
    """POST ``body`` to ``target`` over a connection to one of ``addrs`` (already checked); return the
    HTTP status (0 on a connection or TLS error). Redirects are not followed. 2xx means delivered.
    HTTPS verifies the certificate against ``target.host`` (``context``: default trust store)."""
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        ctx = context or ssl.create_default_context()
        conn = _PinnedHTTPS(target.host, target.port, timeout=timeout_s, context=ctx)
    else:
        conn = _PinnedHTTP(target.host, target.port, timeout=timeout_s)
    conn._pin(addrs)  # type: ignore[attr-defined]
    try:
        conn.request("POST", target.path, body=body, headers=hdrs)
        return int(conn.getresponse().status)
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def new_key(now: float) -> WebhookKey:
    """A fresh signing secret made current at ``now``."""
    return WebhookKey(id="whk_" + ulid(int(now * 1000)).lower(), secret=signing.new_secret(), created_at=now)


def signing_secrets(keys: WebhookKeyStore, tenant: str, now: float) -> list[str]:
    """The secrets a delivery to ``tenant`` at ``now`` is signed with; a first one is created (once, race-free)
    when the tenant has none."""
    found = keys.load(tenant)
    if not found:
        keys.create_first(tenant, new_key(now))  # False: another delivery stored one first
        found = keys.load(tenant)
    return webhook_keys.signing_secrets(found, now)


def tenant_secret(ddb, control_table: str, tenant: str, *, kms, key_id: str, now: float, create: bool = True) -> str:
    """The tenant's current webhook secret at ``now`` (created if missing and ``create``; else KeyError)."""
    store = DynamoWebhookKeys(ddb, control_table, KmsSecretBox(kms, key_id))
    if not create and not store.load(tenant):
        raise KeyError(f"tenant {tenant} has no webhook secret")
    return signing_secrets(store, tenant, now)[0]


def queue_event(sqs, queue_url: str, job: JobRecord, kind: str, *, clock: Clock, discriminator: str = "",
                endpoints: WebhookEndpointStore | None = None) -> list[str]:
    """Queue the ``kind`` event of ``job`` for each target (module contract); return the message ids, the job's
    own webhook first. ``endpoints``: the tenants' endpoints (None: only the job's own webhook)."""
    event = events.build(job, kind, iso(clock.now()), discriminator)
    queue = SqsMessageQueue(sqs, queue_url)
    queued = []
    if event["url"]:
        queue.send(json.dumps(event))
        queued.append(event["msg_id"])
    if endpoints is not None:
        for ep in endpoint_rules.targets(endpoints.all(job.tenant), job.tenant, kind, job.spec.labels):
            msg = {**event, "url": ep.url, "endpoint_id": ep.id,
                   "msg_id": endpoint_rules.endpoint_message_id(event["msg_id"], ep.id)}
            queue.send(json.dumps(msg))
            queued.append(msg["msg_id"])
    return queued


def enqueue(sqs, queue_url: str, job: JobRecord, kind: str, *, clock: Clock,
            discriminator: str = "", endpoints: WebhookEndpointStore | None = None) -> str | None:
    """:func:`queue_event`, returning the first message id (None when no target wants the event)."""
    queued = queue_event(sqs, queue_url, job, kind, clock=clock, discriminator=discriminator, endpoints=endpoints)
    return queued[0] if queued else None


@dataclass(frozen=True)
class Result:
    delivered: bool
    status_code: int
    attempt: int
    next_delay_s: int | None
    #: Why the target is refused (the URL policy, a deleted or disabled endpoint): a permanent failure, no
    #: connection, no retry.
    refused: str | None = None
    #: Another queue message claimed this event: nothing sent, nothing logged, the message is dropped.
    duplicate: bool = False


def _log(store: DeliveryStore, event: dict[str, Any], result: Result, now: float) -> None:
    fields = {
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
    if result.refused:
        fields["reason"] = result.refused
    if event.get("endpoint_id"):
        fields["endpoint_id"] = event["endpoint_id"]
    store.record(event["job_id"], iso(now), event["msg_id"], result.attempt, fields)


def deliver_message(
    body: str,
    receive_count: int,
    *,
    ddb,
    jobs_table: str,
    control_table: str,
    keys: WebhookKeyStore,
    sqs=None,
    queue_url: str | None = None,
    receipt_handle: str | None = None,
    clock: Clock,
    post: Poster = pinned_post,
    resolver: Resolver = resolve,
    allow_private: bool = False,
    timeout_s: float = 10.0,
    endpoints: WebhookEndpointStore | None = None,
    claim: str | None = None,
) -> Result:
    """Deliver one queued event (one try). See the module contract for the URL policy
    (``allow_private`` is the deployment setting ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE``), retries, duplicates
    (``claim``: the queue message's id; None: no claim) and endpoints (``endpoints``: where an endpoint's
    message checks that it is still there and enabled)."""
    store = DynamoDeliveryStore(ddb, jobs_table, control_table)
    event = json.loads(body)
    attempt = max(1, receive_count)
    now = clock.now()
    lease = (events.retry_delay(attempt) or 0) + CLAIM_MARGIN_S
    if claim is not None and not store.claim(event["job_id"], event["msg_id"], claim, now, lease):
        return Result(False, 0, attempt, None, duplicate=True)
    gone = _endpoint_gone(endpoints, event)
    if gone:
        result = Result(False, 0, attempt, None, refused=gone)
        _log(store, event, result, now)
        return result
    try:
        target = urlpolicy.check_url(event["url"], allow_private=allow_private)
        addrs = [target.literal] if target.literal is not None else resolver(target.host, target.port)
        checked = urlpolicy.check_addresses(target.host, [str(a) for a in addrs], allow_private=allow_private)
    except ValidationFailed as err:
        result = Result(False, 0, attempt, None, refused=str(err.extra["errors"][0]["message"]))
        _log(store, event, result, now)
        return result
    except (OSError, UnicodeError):  # resolution failed: an ordinary failed try
        checked = []
    secrets = signing_secrets(keys, event["tenant"], now)
    payload = event["body"].encode()
    hdrs = signing.headers(secrets, event["msg_id"], int(now), payload)
    status = post(target, checked, hdrs, payload, timeout_s) if checked else 0
    ok = 200 <= status < 300
    delay = None if ok else events.retry_delay(attempt)
    result = Result(ok, status, attempt, delay)
    if ok and claim is not None:
        store.mark_delivered(event["job_id"], event["msg_id"], now)
    _log(store, event, result, now)
    if not ok and delay is not None and sqs is not None and queue_url and receipt_handle:
        SqsMessageQueue(sqs, queue_url).retry_later(receipt_handle, delay)
    return result


def _endpoint_gone(endpoints: WebhookEndpointStore | None, event: dict[str, Any]) -> str | None:
    """Why an endpoint's message may no longer be sent (deleted or disabled), else None."""
    if endpoints is None or not event.get("endpoint_id"):
        return None
    try:
        ep = endpoints.get(event["tenant"], event["endpoint_id"])
    except NotFound:
        return f"webhook endpoint {event['endpoint_id']} was deleted"
    return None if ep.enabled else f"webhook endpoint {event['endpoint_id']} is disabled"


def list_deliveries(ddb, jobs_table: str, job_id: str) -> list[dict[str, Any]]:
    """The job's delivery log, oldest first."""
    return DynamoDeliveryStore(ddb, jobs_table, "").list(job_id)


def enqueue_changes(sqs, queue_url: str, changes: list[tuple[dict[str, Any] | None, dict[str, Any] | None]],
                    *, clock: Clock, endpoints: WebhookEndpointStore | None = None) -> list[str]:
    """Queue the ``started`` / ``progress`` events implied by job item changes (old, new images as plain
    dicts), for each job's own subscription and its tenant's matching ``endpoints``. Returns the queued
    message ids."""
    queued = []
    for old, new in changes:
        for kind, disc in events.from_change(old, new):
            queued += queue_event(sqs, queue_url, JobRecord.from_item(new), kind, clock=clock, discriminator=disc,
                                  endpoints=endpoints)
    return queued
