"""Webhook delivery against moto (DynamoDB, SQS) and a loopback HTTP receiver."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.clock import FakeClock, SystemClock
from gpufleet.jobrecord import JobRecord
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints
from gpufleet.tables import TableNames
from gpufleet.webhooks import delivery, events, signing

T = TableNames()


@pytest.fixture
def receiver():
    state = {"status": 200, "got": []}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            state["got"].append((dict(self.headers.items()), body))
            self.send_response(state["status"])
            self.end_headers()

        def log_message(self, *a):
            return

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}/h"
    yield state
    srv.shutdown()
    srv.server_close()


def _queued(aws, new_job, url):
    q = aws["sqs"].create_queue(QueueName=f"hooks-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    job = new_job(webhook=url)
    job["status"] = "SUCCEEDED"
    msg_id = delivery.enqueue(aws["sqs"], q, JobRecord.from_item(job), "completed", clock=FakeClock())
    (msg,) = aws["sqs"].receive_message(QueueUrl=q, AttributeNames=["All"])["Messages"]
    return q, job, msg_id, msg


def test_delivery_signed_with_tenant_secret_and_logged(aws, new_job, receiver):
    q, job, msg_id, msg = _queued(aws, new_job, receiver["url"])
    r = delivery.deliver_message(msg["Body"], 1, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control, keys=aws["keys"],
                                 clock=SystemClock(),
                                 allow_private=True)  # a loopback receiver (the local-development setting)
    assert r.delivered and r.status_code == 200
    hdrs, body = receiver["got"][0]
    secret = delivery.tenant_secret(aws["dynamodb"], T.control, "acme", kms=aws["kms"], key_id=aws["key_id"],
                                    now=time.time(), create=False)
    signing.verify(secret, hdrs, body, now=time.time())
    assert {k.lower(): v for k, v in hdrs.items()}["webhook-id"] == msg_id
    (log,) = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert log["delivered"] is True and log["event_type"] == "job.completed"


def test_failed_delivery_backs_off_via_visibility_then_dead_letters(aws, new_job, receiver):
    receiver["status"] = 503
    q, job, _, msg = _queued(aws, new_job, receiver["url"])
    r = delivery.deliver_message(msg["Body"], 1, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control, keys=aws["keys"],
                                 clock=SystemClock(),
                                 sqs=aws["sqs"], queue_url=q, receipt_handle=msg["ReceiptHandle"], allow_private=True)
    assert not r.delivered and r.next_delay_s == events.RETRY_SCHEDULE_S[0]
    assert aws["sqs"].receive_message(QueueUrl=q).get("Messages") is None  # hidden for the backoff
    last = delivery.deliver_message(msg["Body"], len(events.RETRY_SCHEDULE_S) + 1, ddb=aws["dynamodb"],
                                    jobs_table=T.jobs, control_table=T.control, keys=aws["keys"],
                                 clock=SystemClock(), allow_private=True)
    assert last.next_delay_s is None
    logs = delivery.list_deliveries(aws["dynamodb"], T.jobs, job["job_id"])
    assert [entry["dead_lettered"] for entry in logs] == [False, True]


def test_unreachable_receiver_is_a_failed_try(aws, new_job):
    _, _, _, msg = _queued(aws, new_job, "http://127.0.0.1:9/closed")
    r = delivery.deliver_message(msg["Body"], 2, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control, keys=aws["keys"],
                                 clock=SystemClock(),
                                 timeout_s=1, allow_private=True)
    assert not r.delivered and r.status_code == 0 and r.next_delay_s == events.RETRY_SCHEDULE_S[1]


def test_tenant_secret_created_once_and_never_stored_in_plaintext(aws):
    kw = {"kms": aws["kms"], "key_id": aws["key_id"], "now": time.time()}
    a = delivery.tenant_secret(aws["dynamodb"], T.control, "t1", **kw)
    assert delivery.tenant_secret(aws["dynamodb"], T.control, "t1", **kw) == a and a.startswith("whsec_")
    raw = json.dumps(aws["dynamodb"].get_item(TableName=T.control, Key={"pk": {"S": "TENANT#t1"},
                                                                       "sk": {"S": "TENANT"}})["Item"])
    assert a not in raw and a[len("whsec_"):] not in raw and "webhook_secret" not in raw


def test_rotation_overlap_signs_with_both_secrets_then_only_the_new_one(aws, new_job, receiver):
    from gpufleet.errors import Unauthorized
    from gpufleet.webhooks import keys as rules

    store, now = aws["keys"], time.time()
    old = delivery.tenant_secret(aws["dynamodb"], T.control, "acme", kms=aws["kms"], key_id=aws["key_id"], now=now)
    current = rules.current(store.load("acme"))
    new = delivery.new_key(now)
    store.replace("acme", rules.rotated(store.load("acme"), new, now, 600), current.id)
    _, _, _, msg = _queued(aws, new_job, receiver["url"])
    assert delivery.deliver_message(msg["Body"], 1, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control,
                                    keys=store, clock=SystemClock(), allow_private=True).delivered
    hdrs, body = receiver["got"][-1]
    for secret in (old, new.secret):  # during the overlap a receiver with either secret verifies
        signing.verify(secret, hdrs, body, now=time.time())
    later = FakeClock(now + 601)  # after it, only the new secret signs
    _, _, _, msg = _queued(aws, new_job, receiver["url"])
    assert delivery.deliver_message(msg["Body"], 1, ddb=aws["dynamodb"], jobs_table=T.jobs, control_table=T.control,
                                    keys=store, clock=later, allow_private=True).delivered
    hdrs, body = receiver["got"][-1]
    signing.verify(new.secret, hdrs, body, now=now + 601)
    with pytest.raises(Unauthorized):
        signing.verify(old, hdrs, body, now=now + 601)
    with pytest.raises(Exception, match="another rotation"):  # rotating from a stale view loses
        store.replace("acme", rules.rotated(store.load("acme"), delivery.new_key(now), now, 0), current.id)


def test_sender_handler_reports_batch_item_failures(aws, new_job, receiver, monkeypatch):
    receiver["status"] = 500
    q, _, _, msg = _queued(aws, new_job, receiver["url"])
    monkeypatch.setenv("GPUFLEET_WEBHOOK_QUEUE_URL", q)
    monkeypatch.setenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")
    from lambdas.tasks import webhook_sender

    webhook_sender._clients.cache_clear()
    monkeypatch.setenv("GPUFLEET_WEBHOOK_KEY_ID", aws["key_id"])
    monkeypatch.setattr(webhook_sender, "_clients", lambda: (aws["dynamodb"], aws["sqs"], aws["kms"]))
    monkeypatch.setattr(webhook_sender, "_settings", webhook_sender.SenderSettings.load)
    event = {"Records": [{"messageId": msg["MessageId"], "body": msg["Body"], "receiptHandle": msg["ReceiptHandle"],
                          "attributes": {"ApproximateReceiveCount": "1"}}]}
    assert webhook_sender.handler(event) == {"batchItemFailures": [{"itemIdentifier": msg["MessageId"]}]}
    assert json.loads(receiver["got"][0][1])["type"] == "job.completed"


def test_stream_consumer_queues_subscribed_started_and_progress(aws, new_job, monkeypatch):
    from gpufleet.store.dynamo import marshal
    from lambdas.tasks import webhook_events

    q = aws["sqs"].create_queue(QueueName=f"events-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    monkeypatch.setenv("GPUFLEET_WEBHOOK_QUEUE_URL", q)
    monkeypatch.setattr(webhook_events, "_sqs", lambda: aws["sqs"])
    monkeypatch.setattr(webhook_events, "_settings", webhook_events.EventsSettings.load)
    monkeypatch.setattr(webhook_events, "_endpoints", lambda: DynamoWebhookEndpoints(aws["dynamodb"], T.control))
    job = new_job(webhook="https://hooks.example.com/x")
    job["spec"]["webhook"]["events"] = ["started"]  # progress not subscribed
    old = {**job, "status": "SCHEDULED"}
    new = {**job, "status": "RUNNING", "progress": {"step": 1, "total": 4}}
    record = {"eventName": "MODIFY", "dynamodb": {"OldImage": marshal(old), "NewImage": marshal(new),
                                                  "SequenceNumber": "1"}}
    assert webhook_events.handler({"Records": [record]}) == {"batchItemFailures": []}
    (msg,) = aws["sqs"].receive_message(QueueUrl=q, MaxNumberOfMessages=10)["Messages"]
    assert json.loads(json.loads(msg["Body"])["body"])["type"] == "job.started"
