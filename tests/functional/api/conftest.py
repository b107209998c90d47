"""Fixtures for the API / store functional tests: moto DynamoDB with the real table definitions."""

from __future__ import annotations

import os

import boto3
import pytest
from moto import mock_aws

from gpufleet.clock import FakeClock
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

REGION = "us-east-1"


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
    with mock_aws():
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

ACCOUNT = "123456789012"
ALICE = f"arn:aws:iam::{ACCOUNT}:user/alice"  # t1/vision/alice
BOB = f"arn:aws:iam::{ACCOUNT}:user/bob"  # t1/vision/bob
CAROL = f"arn:aws:iam::{ACCOUNT}:user/carol"  # t2/audio/carol (another tenant)
STRANGER = f"arn:aws:iam::{ACCOUNT}:user/mallory"  # not registered
SECRET = "cursor-secret-for-tests-0123456789"
VIDEO = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}


class Caller:
    """Calls the API handler with REST proxy events the way API Gateway would."""

    def __init__(self, api):
        self.api = api

    def __call__(self, method, path, body=None, *, headers=None, arn=ALICE):
        import json as _json

        from gpufleet.gateway import build_event

        raw = b"" if body is None else (body if isinstance(body, bytes) else _json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        resp = self.api.handle(build_event(method, path, hdrs, raw, user_arn=arn), None)
        return Result(resp)


class Result:
    def __init__(self, resp):
        import json as _json

        self.raw = resp
        self.status = resp["statusCode"]
        hs = dict(resp.get("headers") or {})
        for k, v in (resp.get("multiValueHeaders") or {}).items():
            hs.setdefault(k, v[-1])
        self.headers = {k.lower(): v for k, v in hs.items()}
        self.text = resp.get("body") or ""
        self.json = _json.loads(self.text) if self.text else None


def register_principals(ddb, table):
    from gpufleet.store.principals import put_principal

    put_principal(ddb, table, ALICE, "t1", "vision", "alice")
    put_principal(ddb, table, BOB, "t1", "vision", "bob")
    put_principal(ddb, table, CAROL, "t2", "audio", "carol")


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
    from gpufleet.api.service import Deps
    from gpufleet.api.settings import load

    register_principals(ddb, tables.control)
    settings = load(**{"cursor_secret": SECRET, "idempotency_wait_s": 0.2, **settings_kw})
    sfn = boto3.client("stepfunctions", region_name=REGION)
    batch = boto3.client("batch", region_name=REGION)
    return Deps(settings=settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, clock=clock)


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


KEYS = {
    ALICE: ("AKIAALICE0000000001", "alice-secret-000000000000000000000000000"),
    BOB: ("AKIABOB00000000000001", "bob-secret-0000000000000000000000000000"),
    CAROL: ("AKIACAROL0000000001", "carol-secret-000000000000000000000000000"),
    STRANGER: ("AKIAMALLORY00000001", "mallory-secret-00000000000000000000000"),
}


@pytest.fixture
def gateway(deps):
    from gpufleet.api.app import Api
    from gpufleet.gateway import Gateway, LocalCredential

    creds = [LocalCredential(access_key_id=a, secret_access_key=s, principal_arn=arn) for arn, (a, s) in KEYS.items()]
    with Gateway(lambda: Api(deps).handle, creds, region=REGION) as gw:
        yield gw


def signed_request(method, url, body=None, *, arn=ALICE, headers=None, key=None, service="execute-api", region=REGION):
    """Send a SigV4-signed request (botocore) over loopback; returns the requests.Response."""
    import json as _json

    import requests
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    akid, secret = key or KEYS[arn]
    data = None if body is None else (body if isinstance(body, bytes) else _json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = AWSRequest(method=method, url=url, data=data, headers=hdrs)
    SigV4Auth(Credentials(akid, secret), service, region).add_auth(req)
    return requests.request(method, url, data=data, headers=dict(req.headers.items()), timeout=30)
