"""moto DynamoDB with the real table definitions, an operator and a tenant's user registered."""

from __future__ import annotations

import boto3
import pytest
from adminapi_helpers import ALICE, OPERATOR, REGION
from fast_moto import fast_mock_aws

from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
from gpufleet.clock import FakeClock
from gpufleet.store.principals import put_principal
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


@pytest.fixture
def world():
    with fast_mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        names = TableNames()
        create_tables(ddb, names)
        put_principal(ddb, names.control, OPERATOR, "ops", "platform", "op", admin=True)
        put_principal(ddb, names.control, ALICE, "t1", "vision", "alice")
        api = build_admin_api(AdminApiSettings(control_table=names.control), dynamodb=ddb,
                              clock=FakeClock(1_780_000_000.0))
        yield {"ddb": ddb, "api": api, "tables": names}
