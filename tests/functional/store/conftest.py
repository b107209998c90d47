"""Fixtures for the store functional tests: moto DynamoDB with the real table definitions."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from fast_moto import fast_mock_aws
from store_backends import (
    Backend,
    ObjectSide,
    QueueSide,
    WorkflowSide,
    aws_objects,
    aws_workflow,
    memory_backend,
    memory_objects,
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


# ------------------------------------------------------------------ contract suites
# Each contract test runs once on the in-memory fakes and once on moto (store_backends.py).


@pytest.fixture(params=["memory", "moto"])
def backend(request, clock) -> Backend:
    if request.param == "memory":
        return memory_backend(clock)
    return moto_backend(clock, request.getfixturevalue("ddb"), request.getfixturevalue("tables"))


def _side(request, memory: Callable[[], Any], aws: Callable[[], Any]) -> Any:
    """The fake (``memory``) or, under moto, the AWS adapters (``aws``), as the fixture's parameter says."""
    if request.param == "memory":
        return memory()
    request.getfixturevalue("aws")
    return aws()


@pytest.fixture(params=["memory", "moto"])
def queue_side(request, clock, monkeypatch) -> QueueSide:
    """The MessageQueue contract's two backends: the fake, and SQS on moto (both on ``clock``)."""
    return _side(request, lambda: memory_queue(clock), lambda: sqs_queue(clock, monkeypatch))


@pytest.fixture(params=["memory", "moto"])
def workflow(request) -> WorkflowSide:
    """The workflow contract's two backends: the fakes, and the adapters over moto (see ``aws_workflow``)."""
    return _side(request, memory_workflow, aws_workflow)


@pytest.fixture(params=["memory", "moto"])
def objects(request) -> ObjectSide:
    """The S3 object and STS credential contracts' two backends: the fakes, and the adapters on moto."""
    return _side(request, memory_objects, aws_objects)
