"""moto fixtures for the lifecycle functional tests."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest
from fast_moto import fast_mock_aws
from release_log import ReleaseLog

from gpufleet.clock import FakeClock
from gpufleet.lifecycle.settings import Deps, LifecycleSettings
from gpufleet.store import jobs
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

for _k, _v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(_k, _v)

T = TableNames()


@pytest.fixture(scope="module")
def aws():
    """One moto world per test module (tables take seconds to create); tests use their own jobs."""
    with fast_mock_aws(config={"batch": {"use_docker": False}}):
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(ddb, T)
        clients = {n: boto3.client(n, region_name="us-east-1") for n in ("dynamodb", "sqs", "stepfunctions", "batch", "s3")}
        clients["s3"].create_bucket(Bucket=LifecycleSettings().checkpoints_bucket)
        yield clients


@pytest.fixture
def released() -> ReleaseLog:
    return ReleaseLog()


@pytest.fixture
def deps(aws, released):
    q = aws["sqs"].create_queue(QueueName=f"gpufleet-webhooks-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    return Deps.build(
        aws["dynamodb"], sqs=aws["sqs"], s3=aws["s3"],
        settings=LifecycleSettings(webhook_queue_url=q, heartbeat_seconds=5),
        clock=FakeClock(), rand=lambda: 0.5,
        prompt_check=lambda text: {"allowed": "forbidden" not in text, "reason": "rule"},
        release=released,
    )


@pytest.fixture
def new_job(aws):
    def make(prompt: str = "a cat", webhook: str | None = None, resources: dict | None = None,
             max_run_seconds: int | None = None) -> dict:
        spec = {"workload": {"kind": "video.generate", "prompt": prompt}}
        if resources:
            spec["resources"] = resources
        if max_run_seconds:
            spec["max_run_seconds"] = max_run_seconds
        if webhook:
            spec["webhook"] = {"url": webhook, "events": ["completed"]}
        return jobs.create_job(aws["dynamodb"], T, tenant="acme", team="t", user="u", spec=spec, clock=FakeClock())

    return make
