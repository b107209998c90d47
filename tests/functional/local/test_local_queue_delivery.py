"""The SQS → Lambda delivery component of the dev stack (gpufleet.local.queue_delivery.AsyncQueueDelivery).

Pins moto's own behaviour first (the consumer runs inside SendMessage, on the sender's thread), so the
test fails when moto changes and the component can go; then checks delivery after the send, deletion
of processed batches, redelivery of a failed batch after the visibility timeout, and delayed messages.
"""

from __future__ import annotations

import json
import threading
import time

import boto3
from moto import mock_aws

from gpufleet.devstack import stack as devstack_stack
from gpufleet.local.moto_patches import patch_lambda
from gpufleet.local.queue_delivery import AsyncQueueDelivery

REGION = "us-east-1"


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_local_queue_delivery_invokes_consumers_after_the_send(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert devstack_stack.AsyncQueueDelivery is AsyncQueueDelivery  # the dev stack uses this one
    seen: list[dict] = []
    fail_next = [0]

    def invoker(fn, event):
        records = (json.loads(event) if isinstance(event, str | bytes) else event)["Records"]
        seen.append({"bodies": [r["body"] for r in records], "thread": threading.current_thread().name})
        if fail_next[0]:
            fail_next[0] -= 1
            return json.dumps({"errorType": "Boom"}), True, ""
        return json.dumps({"ok": True}), False, ""

    with mock_aws(), patch_lambda(invoker):
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="hooks", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        role = boto3.client("iam", region_name=REGION).create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam = boto3.client("lambda", region_name=REGION)
        lam.create_function(FunctionName="sender", Runtime="python3.11", Role=role, Handler="h.handler",
                            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})
        lam.create_event_source_mapping(EventSourceArn=arn, FunctionName="sender", BatchSize=10)

        sqs.send_message(QueueUrl=url, MessageBody="moto-alone")
        assert seen == [{"bodies": ["moto-alone"], "thread": threading.current_thread().name}]  # inside the send
        seen.clear()

        with AsyncQueueDelivery(poll_s=0.05) as delivery:
            sqs.send_message(QueueUrl=url, MessageBody="one")
            # the send returned without running a consumer in the sending thread (the background thread
            # may already have delivered by now: a 50 ms poll on a loaded machine)
            assert all(s["thread"] == "sqs-lambda-delivery" for s in seen)
            assert _wait(lambda: seen)
            assert seen[0] == {"bodies": ["one"], "thread": "sqs-lambda-delivery"}
            assert _wait(lambda: "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0))  # deleted

            seen.clear()
            fail_next[0] = 1
            sqs.send_message(QueueUrl=url, MessageBody="flaky")
            assert _wait(lambda: len(seen) >= 2, 10)  # failed once, delivered again after the visibility timeout
            assert [s["bodies"] for s in seen[:2]] == [["flaky"], ["flaky"]]

            seen.clear()
            sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
            time.sleep(0.5)
            assert seen == []
            assert _wait(lambda: seen, 10) and seen[0]["bodies"] == ["later"]
            assert delivery.errors == 0
        seen.clear()
        sqs.send_message(QueueUrl=url, MessageBody="restored")  # moto's own behaviour again after stop
        assert seen and seen[0]["bodies"] == ["restored"] and seen[0]["thread"] == threading.current_thread().name
