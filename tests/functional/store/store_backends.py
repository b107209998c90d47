"""The store contract suites' two backends (see conftest.py's ``backend`` fixture): the
in-memory fakes, and the DynamoDB adapters on moto over the real table definitions."""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from botocore.exceptions import ClientError

from gpufleet.clock import FakeClock, SystemClock
from gpufleet.store.admin import AdminStore, DynamoAdminStore
from gpufleet.store.credentials import CredentialVendor, StsCredentialVendor
from gpufleet.store.deliveries import DeliveryStore, DynamoDeliveryStore
from gpufleet.store.diagnosis import DynamoDiagnosisReader
from gpufleet.store.dynamo import marshal, marshal_value, unmarshal
from gpufleet.store.fakes.admin import MemoryAdminStore
from gpufleet.store.fakes.credentials import MemoryCredentialVendor, Vend
from gpufleet.store.fakes.deliveries import MemoryDeliveryStore
from gpufleet.store.fakes.diagnosis import MemoryDiagnosisReader
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.lease import MemoryLease
from gpufleet.store.fakes.ledger import MemoryLedgerStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.nodes import MemoryNodeStore
from gpufleet.store.fakes.objects import MemoryBucket, MemoryCheckpoints, MemoryJobOutputs
from gpufleet.store.fakes.placements import MemoryPlacementStore
from gpufleet.store.fakes.provenance import MemoryProvenanceIndex
from gpufleet.store.fakes.queues import MemoryMessageQueue, Received
from gpufleet.store.fakes.quotas import MemoryQuotaStore
from gpufleet.store.fakes.ratelimit import MemoryRateLimitStore
from gpufleet.store.fakes.runs import MemoryRunStore
from gpufleet.store.fakes.safety_profiles import MemorySafetyProfiles
from gpufleet.store.fakes.secrets import MemorySecrets
from gpufleet.store.fakes.snapshot import MemorySnapshotReader
from gpufleet.store.fakes.webhook_endpoints import MemoryWebhookEndpoints
from gpufleet.store.fakes.webhook_keys import MemorySecretBox, MemoryWebhookKeys
from gpufleet.store.fakes.workflow import FINISHED_BATCH, MemoryBatchJobs, MemoryEventBus, MemoryTaskTokens, TaskSend
from gpufleet.store.idempotency import DynamoIdempotencyStore, IdempotencyStore
from gpufleet.store.jobs import DynamoJobStore, JobStore
from gpufleet.store.lease import DynamoLease, Lease
from gpufleet.store.ledger import DynamoLedgerStore, LedgerStore
from gpufleet.store.nodes import DynamoNodeStore, NodeStore
from gpufleet.store.objects import Checkpoints, JobOutputs, S3Checkpoints, S3JobOutputs
from gpufleet.store.placements import DynamoPlacementStore
from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceIndex
from gpufleet.store.queues import MessageQueue, SqsMessageQueue
from gpufleet.store.quotas import DynamoQuotaStore, QuotaStore
from gpufleet.store.ratelimit import DynamoRateLimitStore, RateLimitStore
from gpufleet.store.runs import DynamoRunStore, RunStore
from gpufleet.store.safety_profiles import DynamoSafetyProfiles, SafetyProfileStore
from gpufleet.store.secrets import SecretReader, SecretsManagerReader
from gpufleet.store.snapshot import DynamoSnapshotReader, SnapshotReader
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints, WebhookEndpointStore
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox, SecretBox, WebhookKeyStore
from gpufleet.store.workflow import AwsBatchJobs, BatchJobs, EventBridgeBus, EventBus, SfnTaskTokens
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
    box: SecretBox | None = None
    webhook_keys: WebhookKeyStore | None = None
    secrets: SecretReader | None = None
    #: stores a secret's new current value (``bytes``: a binary secret)
    put_secret: Callable[[str, str | bytes], None] | None = None
    diagnosis: Any = None  # DiagnosisReader, plus .truncated and .node_items


def memory_backend(clock: FakeClock) -> Backend:
    db, box, secrets = MemoryDatabase(), MemorySecretBox(), MemorySecrets()
    return Backend(
        "memory", clock, MemoryIdempotencyStore(db, clock), MemoryJobStore(db, clock), db.transact,
        MemoryRateLimitStore(db), MemoryWebhookEndpoints(db), MemoryAdminStore(db, "control"),
        lambda node: db.put("control", {"pk": node_pk(node), "sk": NODE_SK, "node_id": node}),
        MemoryLedgerStore(db), MemoryNodeStore(db), MemoryQuotaStore(db), MemoryDeliveryStore(db),
        lambda table, key, attrs: db.put(table, {**(db.get(table, key) or {"pk": key[0], "sk": key[1]}), **attrs}),
        MemoryPlacementStore(db), db.get, MemoryLease(db), MemoryProvenanceIndex(db), MemorySnapshotReader(db),
        MemoryRunStore(db, clock), safety=MemorySafetyProfiles(db, clock), box=box,
        webhook_keys=MemoryWebhookKeys(db, box), secrets=secrets, put_secret=secrets.put,
        diagnosis=MemoryDiagnosisReader(db),
    )


class Lazy:
    """An object made on first use: most contract tests never touch the KMS key or the Secrets Manager client,
    and making them costs."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._made: Any = None

    def __getattr__(self, name: str):
        if self._made is None:
            self._made = self._make()
        return getattr(self._made, name)


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

    import boto3

    def kms_box() -> KmsSecretBox:
        kms = boto3.client("kms", region_name="us-east-1")
        return KmsSecretBox(kms, kms.create_key(Description="webhook secrets")["KeyMetadata"]["Arn"])

    box = Lazy(kms_box)
    secretsmanager = Lazy(lambda: boto3.client("secretsmanager", region_name="us-east-1"))

    def put_secret(secret_id: str, value: str | bytes) -> None:
        field = {"SecretString": value} if isinstance(value, str) else {"SecretBinary": value}
        try:
            secretsmanager.put_secret_value(SecretId=secret_id, **field)
        except secretsmanager.exceptions.ResourceNotFoundException:
            secretsmanager.create_secret(Name=secret_id, **field)

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
        box=box, webhook_keys=DynamoWebhookKeys(ddb, tables.control, box),
        secrets=SecretsManagerReader(secretsmanager), put_secret=put_secret,
        diagnosis=DynamoDiagnosisReader(ddb, tables),
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


# ------------------------------------------------------------------ workflow services (tokens, Batch, EventBridge)


@dataclass
class WorkflowSide:
    """One backend's workflow adapters and what each service saw."""

    tokens: Any  # RunTokens
    wait: Callable[..., str]  # a task starts waiting on a token
    time_out: Callable[[str], None]  # the task waiting on a token times out
    task_sends: Callable[[], list[TaskSend]]  # what the workflow accepted
    batch: BatchJobs
    submit: Callable[..., str]  # (queue, name, status) -> job id
    batch_state: Callable[[str], tuple[str, str | None]]  # job id -> (status, reason)
    bus: EventBus
    events_seen: Callable[[], list[tuple[str, Any]]]
    refusing_bus: Callable[[], EventBus]


def memory_workflow() -> WorkflowSide:
    tokens, batch, bus = MemoryTaskTokens(), MemoryBatchJobs(), MemoryEventBus()
    return WorkflowSide(tokens, tokens.wait, tokens.time_out, lambda: list(tokens.sent), batch, batch.submit,
                        lambda job_id: (batch.jobs[job_id].status, batch.jobs[job_id].reason), bus,
                        lambda: list(bus.sent), lambda: MemoryEventBus(refusing=True))


class StepFunctionsTasks:
    """A Step Functions client for :class:`SfnTaskTokens` that knows which tokens a task waits on. moto's Step
    Functions accepts any token (it tracks tokens only when it executes state machines, seconds per token), so
    this answers as the service does (``InvalidToken``: never issued; ``TaskDoesNotExist``: already answered;
    ``TaskTimedOut``: the task timed out) and passes every accepted call on to moto's client (which validates
    its parameters). ``fault`` makes every call fail with that error code."""

    def __init__(self, sfn) -> None:
        self.sfn = sfn
        self.waiting: set[str] = set()
        self.gone: dict[str, str] = {}
        self.sent: list[TaskSend] = []
        self.fault: str | None = None

    def wait(self, token: str | None = None) -> str:
        token = token or uuid.uuid4().hex
        self.waiting.add(token)
        return token

    def time_out(self, token: str) -> None:
        self.waiting.discard(token)
        self.gone[token] = "TaskTimedOut"

    def _answer(self, op: str, send: TaskSend, *, ends: bool, call: Callable[[], Any]) -> None:
        code = self.fault or (None if send.token in self.waiting else self.gone.get(send.token, "InvalidToken"))
        if code:
            raise ClientError({"Error": {"Code": code, "Message": code}}, op)
        call()
        if ends:
            self.waiting.discard(send.token)
            self.gone[send.token] = "TaskDoesNotExist"
        self.sent.append(send)

    def send_task_failure(self, *, taskToken: str, error: str, cause: str) -> None:
        self._answer("SendTaskFailure", TaskSend("fail", taskToken, error=error, cause=cause), ends=True,
                     call=lambda: self.sfn.send_task_failure(taskToken=taskToken, error=error, cause=cause))

    def send_task_heartbeat(self, *, taskToken: str) -> None:
        self._answer("SendTaskHeartbeat", TaskSend("heartbeat", taskToken), ends=False,
                     call=lambda: self.sfn.send_task_heartbeat(taskToken=taskToken))

    def send_task_success(self, *, taskToken: str, output: str) -> None:
        self._answer("SendTaskSuccess", TaskSend("succeed", taskToken, output=output), ends=True,
                     call=lambda: self.sfn.send_task_success(taskToken=taskToken, output=output))


class BatchApi:
    """The two AWS Batch calls :class:`AwsBatchJobs` makes, over jobs in any status. moto runs Batch jobs in
    Docker or, without it, finishes them at submission, so it cannot hold an unfinished job. ``ListJobs`` with a
    ``JOB_NAME`` filter returns the queue's jobs of that name in every status (the filter replaces ``jobStatus``);
    ``TerminateJob`` fails an unfinished job with the reason."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}

    def submit(self, queue: str, name: str, status: str = "RUNNABLE") -> str:
        job_id = uuid.uuid4().hex
        self.jobs[job_id] = {"jobId": job_id, "jobQueue": queue, "jobName": name, "status": status}
        return job_id

    def list_jobs(self, *, jobQueue: str, filters: list[dict[str, Any]]) -> dict[str, Any]:
        (f,) = filters
        assert f["name"] == "JOB_NAME"
        return {"jobSummaryList": [{"jobId": j["jobId"], "jobName": j["jobName"], "status": j["status"]}
                                   for j in self.jobs.values()
                                   if j["jobQueue"] == jobQueue and j["jobName"] in f["values"]]}

    def terminate_job(self, *, jobId: str, reason: str) -> None:
        job = self.jobs[jobId]
        if job["status"] not in FINISHED_BATCH:
            job.update(status="FAILED", statusReason=reason)


def aws_workflow() -> WorkflowSide:
    """The workflow adapters over moto's Step Functions (behind :class:`StepFunctionsTasks`) and EventBridge (a rule
    on the bus sends every event to an SQS queue the test reads), and :class:`BatchApi`."""
    import boto3

    tasks = StepFunctionsTasks(boto3.client("stepfunctions", region_name="us-east-1"))
    batch = BatchApi()
    events, sqs = boto3.client("events", region_name="us-east-1"), boto3.client("sqs", region_name="us-east-1")

    @functools.cache
    def subscriber() -> str:  # made on first use: most tests never put an event
        events.create_event_bus(Name="gpufleet")
        url = sqs.create_queue(QueueName="seen-events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="all", EventBusName="gpufleet", EventPattern=json.dumps({"source": ["gpufleet"]}))
        events.put_targets(Rule="all", EventBusName="gpufleet", Targets=[{"Id": "seen", "Arn": arn}])
        return url

    class Bus(EventBridgeBus):
        def put(self, detail_type: str, detail: dict[str, Any]) -> None:
            subscriber()
            super().put(detail_type, detail)

    def seen() -> list[tuple[str, Any]]:
        got = sqs.receive_message(QueueUrl=subscriber(), MaxNumberOfMessages=10).get("Messages", [])
        return [(body["detail-type"], body["detail"]) for body in (json.loads(m["Body"]) for m in got)]

    return WorkflowSide(SfnTaskTokens(tasks), tasks.wait, tasks.time_out, lambda: list(tasks.sent),
                        AwsBatchJobs(batch), batch.submit,
                        lambda job_id: (batch.jobs[job_id]["status"], batch.jobs[job_id].get("statusReason")),
                        Bus(events, "gpufleet"), seen, lambda: EventBridgeBus(events, "no-such-bus"))


# ------------------------------------------------------------------ S3 objects and STS credentials


@dataclass
class ObjectSide:
    """One backend's checkpoint and output stores, the objects under them, and its credential vendor."""

    checkpoints: Checkpoints
    outputs: JobOutputs
    put: Callable[..., None]  # (bucket "checkpoints" | "outputs", key, body, tags=None)
    tags: Callable[[str, str], dict[str, str]]  # (bucket, key) -> tags
    vendor: CredentialVendor
    vended: Callable[[], list[Vend]]  # what the vendor asked STS for


ROLE_ARN = "arn:aws:iam::123456789012:role/gpufleet-node-job"


def memory_objects() -> ObjectSide:
    buckets = {"checkpoints": MemoryBucket(), "outputs": MemoryBucket()}
    vendor = MemoryCredentialVendor(SystemClock(), ROLE_ARN, 900)
    return ObjectSide(MemoryCheckpoints(buckets["checkpoints"]), MemoryJobOutputs(buckets["outputs"]),
                      lambda bucket, key, body, tags=None: buckets[bucket].put(key, body, tags),
                      lambda bucket, key: buckets[bucket].tags(key), vendor, lambda: list(vendor.vended))


class RecordingSts:
    """moto's STS client, keeping each AssumeRole request (the session name and policy it was sent)."""

    def __init__(self, sts) -> None:
        self.sts = sts
        self.vended: list[Vend] = []

    def assume_role(self, **kw: Any) -> dict[str, Any]:
        resp = self.sts.assume_role(**kw)
        self.vended.append(Vend(kw["RoleArn"], kw["RoleSessionName"], json.loads(kw["Policy"]), kw["DurationSeconds"]))
        return resp


def aws_objects() -> ObjectSide:
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    for bucket in ("checkpoints", "outputs"):
        s3.create_bucket(Bucket=bucket)

    def put(bucket: str, key: str, body: bytes, tags: dict[str, str] | None = None) -> None:
        s3.put_object(Bucket=bucket, Key=key, Body=body, Tagging=urlencode(tags or {}))

    sts = RecordingSts(boto3.client("sts", region_name="us-east-1"))
    return ObjectSide(S3Checkpoints(s3, "checkpoints"), S3JobOutputs(s3, "outputs"), put,
                      lambda bucket, key: {t["Key"]: t["Value"]
                                           for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]},
                      StsCredentialVendor(sts, ROLE_ARN, 900), lambda: list(sts.vended))
