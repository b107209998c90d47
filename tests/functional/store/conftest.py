"""Fixtures for the store functional tests: moto DynamoDB with the real table definitions."""

from __future__ import annotations

import os

import boto3
import pytest
from moto import mock_aws
from store_backends import (
    Backend,
    QueueSide,
    WorkflowSide,
    aws_workflow,
    memory_backend,
    memory_queue,
    memory_workflow,
    moto_backend,
    sqs_queue,
)

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


# ------------------------------------------------------------------ contract suites
# Each contract test runs once on the in-memory fakes and once on moto (store_backends.py).


@pytest.fixture(params=["memory", "moto"])
def backend(request, clock) -> Backend:
    if request.param == "memory":
        return memory_backend(clock)
    return moto_backend(clock, request.getfixturevalue("ddb"), request.getfixturevalue("tables"))


@pytest.fixture(params=["memory", "moto"])
def queue_side(request, clock, monkeypatch) -> QueueSide:
    """The MessageQueue contract's two backends: the fake, and SQS on moto (both on ``clock``)."""
    if request.param == "memory":
        return memory_queue(clock)
    request.getfixturevalue("aws")
    return sqs_queue(clock, monkeypatch)


@pytest.fixture(params=["memory", "moto"])
def workflow(request) -> WorkflowSide:
    """The workflow contract's two backends: the fakes, and the adapters over moto (see ``aws_workflow``)."""
    if request.param == "memory":
        return memory_workflow()
    request.getfixturevalue("aws")
    return aws_workflow()
