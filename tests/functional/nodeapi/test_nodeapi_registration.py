"""``POST /v1/nodes`` is an operator's act: a tenant (or an unknown principal) cannot register a node, bind it to
a pool or get a node queue created; an admin principal can (lambdas/nodes/register.py, on moto)."""

from __future__ import annotations

import json

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.store.dynamo import marshal
from gpufleet.store.principals import put_principal
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

T = TableNames()
ACCOUNT = "123456789012"
TENANT_ARN = f"arn:aws:iam::{ACCOUNT}:user/alice"
ADMIN_ARN = f"arn:aws:iam::{ACCOUNT}:role/platform-operator"
BODY = {"node_id": "node-9", "pool": "onprem-a", "site": "eu-west", "gpus": 2}


@pytest.fixture
def aws(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_REGION": "us-east-1", "GPUFLEET_CONTROL_TABLE": T.control}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    from lambdas.nodes import register

    register._settings.cache_clear()
    with fast_mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(ddb, T)
        put_principal(ddb, T.control, TENANT_ARN, "t1", "vision", "alice")
        put_principal(ddb, T.control, ADMIN_ARN, "ops", "platform", "operator", admin=True)
        yield ddb, boto3.client("sqs", region_name="us-east-1")
    register._settings.cache_clear()


def _post(arn: str | None) -> dict:
    from lambdas.nodes.register import handler

    return handler({"httpMethod": "POST", "path": "/v1/nodes", "body": json.dumps(BODY),
                    "requestContext": {"identity": {"userArn": arn}}})


def _registration(ddb) -> dict | None:
    return ddb.get_item(TableName=T.control, Key=marshal({"pk": "NODE#node-9", "sk": "REGISTRATION"})).get("Item")


@pytest.mark.parametrize(("arn", "status"), [(TENANT_ARN, 403), (f"arn:aws:iam::{ACCOUNT}:user/mallory", 403),
                                             (None, 403)])
def test_anyone_but_an_operator_is_refused_and_nothing_is_created(aws, arn, status):
    ddb, sqs = aws
    resp = _post(arn)
    assert resp["statusCode"] == status and resp["headers"]["content-type"] == "application/problem+json"
    assert _registration(ddb) is None
    assert not sqs.list_queues().get("QueueUrls")


def test_an_operator_binds_the_node_to_its_pool(aws):
    ddb, sqs = aws
    resp = _post(ADMIN_ARN)
    assert resp["statusCode"] == 201
    body = json.loads(resp["body"])
    assert body["pool"] == "onprem-a" and body["queue_url"].endswith("/gpufleet-node-node-9")
    # the node's signal queue (cancel nudges) beside it, short-lived messages, the node's tag
    assert body["signals_url"] == body["queue_url"] + "_signals"
    attrs = sqs.get_queue_attributes(QueueUrl=body["signals_url"], AttributeNames=["All"])["Attributes"]
    assert attrs["MessageRetentionPeriod"] == "600" and attrs["SqsManagedSseEnabled"] == "true"
    assert sqs.list_queue_tags(QueueUrl=body["signals_url"])["Tags"] == {"gpufleet:node": "node-9"}
    # registering again returns the same queues
    assert json.loads(_post(ADMIN_ARN)["body"])["signals_url"] == body["signals_url"]
    reg = _registration(ddb)
    assert reg["pool"]["S"] == "onprem-a" and reg["registered_by"]["S"] == ADMIN_ARN
