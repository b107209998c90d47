"""DynamoDB stream → Lambda delivery in the dev stack: after the transaction, not inside it.

The first test pins moto's own behaviour (synchronous delivery inside the write, mid-transaction);
it fails when moto changes, so the patch can go.
"""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest
from moto import mock_aws

from gpufleet.devstack.stream_delivery import AsyncStreamDelivery
from gpufleet.local.moto_patches import patch_lambda

REGION = "us-east-1"


@pytest.fixture
def world(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    seen: list[dict] = []
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)

        def invoker(fn, event):
            records = json.loads(event)["Records"] if isinstance(event, str | bytes) else event["Records"]
            # what the consumer can read at the moment it is invoked
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
            iam = boto3.client("iam", region_name=REGION)
            role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            lam = boto3.client("lambda", region_name=REGION)
            lam.create_function(FunctionName="outbox", Runtime="python3.11", Role=role, Handler="h.handler",
                                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})
            lam.create_event_source_mapping(EventSourceArn=stream, FunctionName="outbox", StartingPosition="LATEST")
            yield ddb, seen


def _transact(ddb):
    ddb.transact_write_items(TransactItems=[{"Put": {"TableName": "t", "Item": {"pk": {"S": k}}}} for k in ("a", "b")])


def test_moto_delivers_inside_the_transaction(world):
    ddb, seen = world
    _transact(ddb)
    assert seen[0]["keys"] == ["a"] and seen[0]["visible"] == {"a": True, "b": False}


def test_async_delivery_runs_after_the_transaction_in_one_batch(world):
    ddb, seen = world
    with AsyncStreamDelivery(settle_s=0.02) as delivery:
        _transact(ddb)
        assert seen == []  # the write returned before any consumer ran
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        ddb.put_item(TableName="t", Item={"pk": {"S": "c"}})
    assert seen[0]["keys"] == ["a", "b"] and seen[0]["visible"] == {"a": True, "b": True}
    assert seen[0]["thread"] == "dynamodb-stream-delivery"
    assert [s["keys"] for s in seen[1:]] == [["c"]]  # delivered on stop, not re-sent
    assert delivery.errors == 0
    _transact(ddb)  # moto restored: synchronous again
    assert [s["keys"] for s in seen[-2:]] == [["a"], ["b"]]
