"""The store contract suites' two backends (see conftest.py's ``backend`` fixture): the
in-memory fakes, and the DynamoDB adapters on moto over the real table definitions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.clock import FakeClock
from gpufleet.store.admin import AdminStore, DynamoAdminStore
from gpufleet.store.deliveries import DeliveryStore, DynamoDeliveryStore
from gpufleet.store.dynamo import marshal, marshal_value, unmarshal
from gpufleet.store.fakes.admin import MemoryAdminStore
from gpufleet.store.fakes.deliveries import MemoryDeliveryStore
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.lease import MemoryLease
from gpufleet.store.fakes.ledger import MemoryLedgerStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.nodes import MemoryNodeStore
from gpufleet.store.fakes.placements import MemoryPlacementStore
from gpufleet.store.fakes.provenance import MemoryProvenanceIndex
from gpufleet.store.fakes.queues import MemoryMessageQueue, Received
from gpufleet.store.fakes.quotas import MemoryQuotaStore
from gpufleet.store.fakes.ratelimit import MemoryRateLimitStore
from gpufleet.store.fakes.runs import MemoryRunStore
from gpufleet.store.fakes.safety_profiles import MemorySafetyProfiles
from gpufleet.store.fakes.snapshot import MemorySnapshotReader
from gpufleet.store.fakes.webhook_endpoints import MemoryWebhookEndpoints
from gpufleet.store.idempotency import DynamoIdempotencyStore, IdempotencyStore
from gpufleet.store.jobs import DynamoJobStore, JobStore
from gpufleet.store.lease import DynamoLease, Lease
from gpufleet.store.ledger import DynamoLedgerStore, LedgerStore
from gpufleet.store.nodes import DynamoNodeStore, NodeStore
from gpufleet.store.placements import DynamoPlacementStore
from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceIndex
from gpufleet.store.queues import MessageQueue, SqsMessageQueue
from gpufleet.store.quotas import DynamoQuotaStore, QuotaStore
from gpufleet.store.ratelimit import DynamoRateLimitStore, RateLimitStore
from gpufleet.store.runs import DynamoRunStore, RunStore
from gpufleet.store.safety_profiles import DynamoSafetyProfiles, SafetyProfileStore
from gpufleet.store.snapshot import DynamoSnapshotReader, SnapshotReader
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints, WebhookEndpointStore
from gpufleet.tables import NODE_SK, TableNames, node_pk

QUEUE_VISIBILITY_S = 30

# Each contract test runs once on the in-memory fakes and once on moto (the real DynamoDB
# adapters over the real table definitions). A Backend builds the stores of one backend over
# one shared state, and commits a list of joined writes (what a store's ``extra_items``
# receive) the way that backend's transactions do.


@dataclass
class Backend:
    name: str
    clock: FakeClock
    idempotency: IdempotencyStore
    jobs: JobStore
    commit: Callable[[Sequence[Any]], None]
    rate_limits: RateLimitStore | None = None
    webhook_endpoints: WebhookEndpointStore | None = None
    admin: AdminStore | None = None
    #: writes a node's liveness item (what the node API writes; the admin store only marks it draining)
    put_node: Callable[[str], None] | None = None
    ledger: LedgerStore | None = None
    nodes: NodeStore | None = None
    quotas: QuotaStore | None = None
    deliveries: DeliveryStore | None = None
    #: sets attributes on an item of a table ("jobs", "control", "ledger") as another writer would (a placement
    #: transaction's usage counters, say), creating the item when missing
    set_attrs: Callable[[str, tuple[str, str], dict[str, Any]], None] | None = None
    placements: Any = None  # PlacementStore, plus release(job_id, epoch, clock=)
    #: reads an item of a table ("jobs", "control", "ledger") as stored (None when missing)
    get_item: Callable[[str, tuple[str, str]], dict[str, Any] | None] | None = None
    lease: Lease | None = None
    provenance: ProvenanceIndex | None = None
    snapshot: SnapshotReader | None = None
    runs: RunStore | None = None
    safety: SafetyProfileStore | None = None


def memory_backend(clock: FakeClock) -> Backend:
    db = MemoryDatabase()
    return Backend(
        "memory", clock, MemoryIdempotencyStore(db, clock), MemoryJobStore(db, clock), db.transact,
        MemoryRateLimitStore(db), MemoryWebhookEndpoints(db), MemoryAdminStore(db, "control"),
        lambda node: db.put("control", {"pk": node_pk(node), "sk": NODE_SK, "node_id": node}),
        MemoryLedgerStore(db), MemoryNodeStore(db), MemoryQuotaStore(db), MemoryDeliveryStore(db),
        lambda table, key, attrs: db.put(table, {**(db.get(table, key) or {"pk": key[0], "sk": key[1]}), **attrs}),
        MemoryPlacementStore(db), db.get, MemoryLease(db), MemoryProvenanceIndex(db), MemorySnapshotReader(db),
        MemoryRunStore(db, clock), safety=MemorySafetyProfiles(db, clock),
    )


class AtomicCalls:
    """A client whose calls run one at a time. DynamoDB applies each conditional write atomically;
    moto in-process checks a condition and then writes, so racing threads could both pass a
    check. Serialising calls restores the guarantee the contracts rely on (nothing more)."""

    def __init__(self, client) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return call


def moto_backend(clock: FakeClock, ddb, tables: TableNames) -> Backend:
    ddb = AtomicCalls(ddb)

    def commit(writes: Sequence[Any]) -> None:
        ddb.transact_write_items(TransactItems=list(writes))

    return Backend(
        "moto", clock, DynamoIdempotencyStore(ddb, tables.control, clock, poll_s=0.01),
        DynamoJobStore(ddb, tables, clock), commit, DynamoRateLimitStore(ddb, tables.control),
        DynamoWebhookEndpoints(ddb, tables.control), DynamoAdminStore(ddb, tables.control),
        lambda node: ddb.put_item(TableName=tables.control,
                                  Item=marshal({"pk": node_pk(node), "sk": NODE_SK, "node_id": node})),
        DynamoLedgerStore(ddb, tables), DynamoNodeStore(ddb, tables.control), DynamoQuotaStore(ddb, tables.control),
        DynamoDeliveryStore(ddb, tables.jobs),
        lambda table, key, attrs: ddb.update_item(
            TableName=getattr(tables, table), Key=marshal({"pk": key[0], "sk": key[1]}),
            UpdateExpression="SET " + ", ".join(f"#a{i} = :a{i}" for i in range(len(attrs))),
            ExpressionAttributeNames={f"#a{i}": k for i, k in enumerate(attrs)},
            ExpressionAttributeValues={f":a{i}": marshal_value(v) for i, v in enumerate(attrs.values())}),
        DynamoPlacementStore(ddb, tables),
        lambda table, key: unmarshal(ddb.get_item(TableName=getattr(tables, table), ConsistentRead=True,
                                                  Key=marshal({"pk": key[0], "sk": key[1]})).get("Item")),
        DynamoLease(ddb, tables.control), DynamoProvenanceIndex(ddb, tables.jobs), DynamoSnapshotReader(ddb, tables),
        DynamoRunStore(ddb, tables.jobs, clock), safety=DynamoSafetyProfiles(ddb, tables.control, clock),
    )




# ------------------------------------------------------------------ SQS (the MessageQueue contract)


@dataclass
class QueueSide:
    """One backend's :class:`~gpufleet.store.queues.MessageQueue` and the consumer's side of its queue."""

    queue: MessageQueue
    receive: Callable[..., list[Received]]
    delete: Callable[[str], None]


def memory_queue(clock: FakeClock) -> QueueSide:
    queue = MemoryMessageQueue(clock, visibility_timeout_s=QUEUE_VISIBILITY_S)
    return QueueSide(queue, queue.receive, queue.delete)


def sqs_queue(clock: FakeClock, monkeypatch) -> QueueSide:
    """:class:`SqsMessageQueue` on moto, whose visibility timeouts run on ``clock`` (moto's SQS reads the time
    through these two functions), so no test sleeps."""
    import boto3
    import moto.sqs.models as sqs_models

    monkeypatch.setattr(sqs_models, "unix_time", lambda *_: clock.now())
    monkeypatch.setattr(sqs_models, "unix_time_millis", lambda *_: clock.now() * 1000)
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="contract", Attributes={"VisibilityTimeout": str(QUEUE_VISIBILITY_S)})["QueueUrl"]

    def receive(max_messages: int = 10, visibility_timeout_s: int | None = None) -> list[Received]:
        extra = {} if visibility_timeout_s is None else {"VisibilityTimeout": visibility_timeout_s}
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=max_messages,
                                  MessageSystemAttributeNames=["ApproximateReceiveCount"], **extra)
        return [Received(m["MessageId"], m["Body"], m["ReceiptHandle"], int(m["Attributes"]["ApproximateReceiveCount"]))
                for m in got.get("Messages", [])]

    return QueueSide(SqsMessageQueue(sqs, url), receive,
                     lambda handle: sqs.delete_message(QueueUrl=url, ReceiptHandle=handle))
