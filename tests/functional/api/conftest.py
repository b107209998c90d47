"""Fixtures for the API / store functional tests: moto DynamoDB with the real table definitions."""

from __future__ import annotations

import os

import boto3
import pytest
from api_helpers import KEYS, REGION, SECRET, Caller, register_principals
from fast_moto import fast_mock_aws

from gpufleet.clock import FakeClock
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    os.environ.pop("MOTO_PORT", None)


@pytest.fixture
def aws():
    with fast_mock_aws():
        yield


@pytest.fixture
def ddb(aws):
    return boto3.client("dynamodb", region_name=REGION)


@pytest.fixture
def tables(ddb) -> TableNames:
    names = TableNames()
    create_tables(ddb, names)
    return names


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_780_000_000.0)


# ------------------------------------------------------------------ API fixtures


@pytest.fixture
def s3(aws):
    from gpufleet.store.objects import s3_client

    client = s3_client(REGION)
    for b in ("gpufleet-outputs", "gpufleet-logs"):
        client.create_bucket(Bucket=b)
    return client


@pytest.fixture
def settings_kw():
    """Override to change API settings in a test module."""
    return {}


@pytest.fixture
def deps(ddb, s3, tables, clock, settings_kw):
    from gpufleet.api.settings import load
    from gpufleet.api.wiring import build_deps

    register_principals(ddb, tables.control)
    settings = load(**{"cursor_secret": SECRET, "idempotency_wait_s": 0.2, **settings_kw})
    sfn = boto3.client("stepfunctions", region_name=REGION)
    batch = boto3.client("batch", region_name=REGION)
    return build_deps(settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, clock=clock)


@pytest.fixture
def call(deps):
    from gpufleet.api.app import Api

    return Caller(Api(deps))


@pytest.fixture
def serialized_dynamodb(monkeypatch):
    """Make each moto DynamoDB request atomic, as every DynamoDB request is.

    moto evaluates a ConditionExpression and then writes without a lock, so two
    threads can both pass ``attribute_not_exists``; real DynamoDB serialises
    writes per item. One lock around moto's DynamoDB request handling restores
    that guarantee for the concurrency tests (it does not change any result a
    single request gets).
    """
    import threading

    from moto.dynamodb.responses import DynamoHandler

    lock = threading.Lock()
    real = DynamoHandler.call_action

    def call_action(self):
        with lock:
            return real(self)

    monkeypatch.setattr(DynamoHandler, "call_action", call_action)


@pytest.fixture
def gateway(deps):
    from gpufleet.api.app import Api
    from gpufleet.devstack.gateway import Gateway, LocalCredential

    creds = [LocalCredential(access_key_id=a, secret_access_key=s, principal_arn=arn) for arn, (a, s) in KEYS.items()]
    with Gateway(lambda: Api(deps).handle, creds, region=REGION) as gw:
        yield gw
