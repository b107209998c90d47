"""The moto stream-delivery patch (gpufleet.local.moto_patches.AsyncStreamDelivery).

Pins moto's own behaviour first (consumer invoked inside the write, mid-transaction), so the test
fails when moto changes and the patch can go; then checks the patch delivers after the write.
"""

from __future__ import annotations

import json
import threading
import time

import boto3
from moto import mock_aws

from gpufleet.devstack import stack as devstack_stack
from gpufleet.local.moto_patches import AsyncStreamDelivery, patch_lambda

REGION = "us-east-1"


def test_local_stream_delivery_defers_consumers_until_after_the_write(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert devstack_stack.AsyncStreamDelivery is AsyncStreamDelivery  # the dev stack uses this one
    seen: list[dict] = []
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)

        def invoker(fn, event):
            records = json.loads(event)["Records"] if isinstance(event, str | bytes) else event["Records"]
            visible = {k: "Item" in ddb.get_item(TableName="t", Key={"pk": {"S": k}}) for k in ("a", "b")}
            seen.append({"keys": [r["dynamodb"]["Keys"]["pk"]["S"] for r in records], "visible": visible,
                         "thread": threading.current_thread().name})
            return json.dumps({"ok": True}), False, ""

        with patch_lambda(invoker):
            stream = ddb.create_table(
                TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
                StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            )["TableDescription"]["LatestStreamArn"]
            role = boto3.client("iam", region_name=REGION).create_role(
                RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            lam = boto3.client("lambda", region_name=REGION)
            lam.create_function(FunctionName="outbox", Runtime="python3.11", Role=role, Handler="h.handler",
                                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})
            lam.create_event_source_mapping(EventSourceArn=stream, FunctionName="outbox", StartingPosition="LATEST")

            def transact():
                ddb.transact_write_items(
                    TransactItems=[{"Put": {"TableName": "t", "Item": {"pk": {"S": k}}}} for k in ("a", "b")])

            transact()  # moto alone: one call per item, inside the write
            assert [s["keys"] for s in seen] == [["a"], ["b"]]
            assert seen[0]["visible"] == {"a": True, "b": False}
            seen.clear()
            with AsyncStreamDelivery(settle_s=0.02) as delivery:
                transact()
                assert seen == []  # the write returned before any consumer ran
                deadline = time.monotonic() + 5
                while not seen and time.monotonic() < deadline:
                    time.sleep(0.01)
            assert seen[0]["keys"] == ["a", "b"] and seen[0]["visible"] == {"a": True, "b": True}
            assert seen[0]["thread"] == "dynamodb-stream-delivery" and delivery.errors == 0
            seen.clear()
            transact()  # restored on stop: synchronous again
            assert [s["keys"] for s in seen] == [["a"], ["b"]]
