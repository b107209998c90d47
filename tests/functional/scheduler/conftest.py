"""Fixtures for the scheduler's functional tests: moto DynamoDB with the real tables. The item helpers
(``sched_moto``) are shared with the store's tests and live there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))


@pytest.fixture
def aws():
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with fast_mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        names = TableNames()
        create_tables(ddb, names)
        yield ddb, names
