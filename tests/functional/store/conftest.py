"""Fixtures for the store functional tests: moto DynamoDB with the real table definitions."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpufleet.clock import FakeClock
from gpufleet.store.fakes.idempotency import MemoryIdempotencyStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.idempotency import DynamoIdempotencyStore, IdempotencyStore
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
# Each contract test runs once on the in-memory fakes and once on moto (the real DynamoDB
# adapters over the real table definitions). A Backend builds the stores of one backend over
# one shared state, and commits a list of joined writes (what a store's ``extra_items``
# receive) the way that backend's transactions do.


@dataclass
class Backend:
    name: str
    clock: FakeClock
    idempotency: IdempotencyStore
    commit: Callable[[Sequence[Any]], None]


def _memory_backend(clock: FakeClock) -> Backend:
    db = MemoryDatabase()
    return Backend("memory", clock, MemoryIdempotencyStore(db, clock), db.transact)


class AtomicCalls:
    """A client whose calls run one at a time. DynamoDB applies each conditional write atomically;
    moto in-process checks a condition and then writes, so racing threads could both pass a
    check. Serialising calls restores the guarantee the contracts rely on (nothing more)."""

    def __init__(self, client) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return call


def _moto_backend(clock: FakeClock, ddb, tables: TableNames) -> Backend:
    ddb = AtomicCalls(ddb)

    def commit(writes: Sequence[Any]) -> None:
        ddb.transact_write_items(TransactItems=list(writes))

    return Backend("moto", clock, DynamoIdempotencyStore(ddb, tables.control, clock, poll_s=0.01), commit)


@pytest.fixture(params=["memory", "moto"])
def backend(request, clock) -> Backend:
    if request.param == "memory":
        return _memory_backend(clock)
    return _moto_backend(clock, request.getfixturevalue("ddb"), request.getfixturevalue("tables"))
