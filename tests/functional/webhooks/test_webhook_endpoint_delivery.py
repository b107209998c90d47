"""Deliveries to tenants' webhook endpoints (moto DynamoDB, SQS, KMS; a loopback receiver): fanned out with the
job's own webhook, signed with the tenant's secret, logged with the endpoint id, once per (endpoint, event)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.clock import FakeClock
from gpufleet.jobrecord import JobRecord
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints
from gpufleet.tables import TableNames
from gpufleet.webhooks import delivery, signing
from gpufleet.webhooks.endpoints import WebhookEndpoint, new_endpoint_id

T = TableNames()


@pytest.fixture
def receiver():
    got: list[tuple[str, dict, bytes]] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append((self.path, dict(self.headers.items()), self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(500 if self.path.endswith("/down") else 200)
            self.end_headers()

        def log_message(self, *a):
            return

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", got
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def sender(aws, monkeypatch):
    from lambdas.tasks import webhook_sender

    monkeypatch.setenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")  # the loopback receiver
    monkeypatch.setenv("GPUFLEET_WEBHOOK_KEY_ID", aws["key_id"])
    monkeypatch.setattr(webhook_sender, "_clients", lambda: (aws["dynamodb"], aws["sqs"], aws["kms"]))
    monkeypatch.setattr(webhook_sender, "_settings", webhook_sender.SenderSettings.load)

    def run(queue: str) -> dict:
        msgs = aws["sqs"].receive_message(QueueUrl=queue, MaxNumberOfMessages=10, AttributeNames=["All"])
        records = [{"messageId": m["MessageId"], "body": m["Body"], "receiptHandle": m["ReceiptHandle"],
                    "attributes": m["Attributes"], "eventSourceARN": "arn:aws:sqs:us-east-1:1:" + queue.rsplit("/")[-1]}
                   for m in msgs.get("Messages", [])]
        return webhook_sender.handler({"Records": records})

    return run


def _endpoint(store, tenant: str, url: str, events=("completed",), labels=None) -> WebhookEndpoint:
    ep = WebhookEndpoint(id=new_endpoint_id(time.time()), tenant=tenant, url=url, events=tuple(events),
                         labels=labels or {})
    store.create(ep)
    return ep


def test_endpoint_deliveries_verify_with_the_tenant_secret_once_per_endpoint_and_event(aws, new_job, receiver,
                                                                                     sender):
    from gpufleet.api import service, webhook_endpoints
    from gpufleet.api.models import WebhookEndpointRequest
    from gpufleet.api.settings import load
    from gpufleet.store.principals import Principal

    base, got = receiver
    tenant = f"acme-{uuid.uuid4().hex[:6]}"  # the module's moto world is shared: a tenant of its own
    who = Principal(arn="arn:aws:iam::1:user/a", tenant=tenant, team="t", user="a")
    api = service.Deps(settings=load(cursor_secret="c" * 32, webhook_key_id=aws["key_id"], webhook_allow_private=True),
                       ddb=aws["dynamodb"], kms=aws["kms"], clock=FakeClock(time.time()))
    # the tenant registers the endpoint and fetches its signing secret through the API's operations
    ep = webhook_endpoints.create(api, who, WebhookEndpointRequest(url=f"{base}/ep"))
    (fetched,) = service.webhook_secrets(api, who).secrets
    store = DynamoWebhookEndpoints(aws["dynamodb"], T.control)
    _endpoint(store, tenant, f"{base}/started-only", events=("started",))
    _endpoint(store, tenant, f"{base}/other-label", labels={"team": "audio"})
    _endpoint(store, "someone-else", f"{base}/other-tenant")
    job = new_job(webhook=f"{base}/own")
    job.update(status="SUCCEEDED", tenant=tenant)
    job["spec"]["labels"] = {"team": "vision"}
    record = JobRecord.from_item(job)
    q = aws["sqs"].create_queue(QueueName=f"hooks-{uuid.uuid4().hex[:8]}")["QueueUrl"]

    queued = delivery.queue_event(aws["sqs"], q, record, "completed", clock=FakeClock(), endpoints=store)
    assert len(queued) == 2
    assert sender(q) == {"batchItemFailures": []}
    assert sorted(p for p, _, _ in got) == ["/ep", "/own"]
    for _, hdrs, body in got:
        signing.verify(fetched.secret, hdrs, body, now=time.time())
        assert json.loads(body)["data"]["job_id"] == job["job_id"]
    log = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert sorted((d.get("endpoint_id") or "", d["delivered"]) for d in log) == [("", True), (ep.id, True)]
    assert {d["msg_id"] for d in log} == set(queued)

    # a retried Notify queues the same event again: both messages are duplicates, nothing is sent or logged
    assert delivery.queue_event(aws["sqs"], q, record, "completed", clock=FakeClock(), endpoints=store) == queued
    assert sender(q) == {"batchItemFailures": []}
    assert len(got) == 2 and len(delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])) == 2


def test_a_disabled_or_deleted_endpoint_gets_no_queued_try(aws, new_job, receiver, sender):
    base, got = receiver
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    store = DynamoWebhookEndpoints(aws["dynamodb"], T.control)
    off, gone = _endpoint(store, tenant, f"{base}/off"), _endpoint(store, tenant, f"{base}/gone")
    job = new_job()
    job.update(status="FAILED", tenant=tenant)
    q = aws["sqs"].create_queue(QueueName=f"hooks-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    assert len(delivery.queue_event(aws["sqs"], q, JobRecord.from_item(job), "completed", clock=FakeClock(),
                                    endpoints=store)) == 2
    store.set_enabled(tenant, off.id, False, "2026-01-01T00:00:00Z")
    store.delete(tenant, gone.id)
    assert sender(q) == {"batchItemFailures": []}  # dropped, not handed back for a retry
    assert got == []
    log = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert sorted((d["endpoint_id"], d["dead_lettered"], d["reason"].split()[-1]) for d in log) == sorted(
        [(off.id, True, "disabled"), (gone.id, True, "deleted")])
    # and once disabled, nothing is queued for it at all
    assert delivery.queue_event(aws["sqs"], q, JobRecord.from_item(job), "completed", clock=FakeClock(),
                                endpoints=store) == []


def test_a_claim_holds_the_event_through_its_retry_and_a_redriven_message_takes_over_after(aws, new_job, receiver):
    from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox

    base, got = receiver
    job = new_job(webhook=f"{base}/down")
    job["status"] = "SUCCEEDED"
    q = aws["sqs"].create_queue(QueueName=f"hooks-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    (msg_id,) = delivery.queue_event(aws["sqs"], q, JobRecord.from_item(job), "completed", clock=FakeClock())
    body = aws["sqs"].receive_message(QueueUrl=q)["Messages"][0]["Body"]
    keys = DynamoWebhookKeys(aws["dynamodb"], T.control, KmsSecretBox(aws["kms"], aws["key_id"]))
    now = time.time()

    def send(owner: str, at: float, attempt: int = 1):
        return delivery.deliver_message(body, attempt, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control,
                                        keys=keys, clock=FakeClock(at), allow_private=True, claim=owner)

    first = send("m1", now)
    assert not first.delivered and first.next_delay_s == 5 and len(got) == 1
    assert send("m2", now + 1).duplicate and len(got) == 1  # a duplicate while the first one's retry is due
    assert not send("m1", now + 5, attempt=2).duplicate and len(got) == 2  # the first message's own retry
    # dead-lettered after its last try and redriven under a new id: once the lease ran out it may try again
    later = now + 5 + 300 + delivery.CLAIM_MARGIN_S + 1
    assert not send("m3", later).duplicate and len(got) == 3
    assert send("m4", later + 1).duplicate
