"""moto fixtures for the webhook delivery functional tests: DynamoDB tables, SQS, and jobs to notify about."""

from __future__ import annotations

import os

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.clock import FakeClock
from gpufleet.lifecycle.settings import LifecycleSettings
from gpufleet.store import jobs
from gpufleet.store.schema import create_tables
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox
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
        clients = {n: boto3.client(n, region_name="us-east-1")
                   for n in ("dynamodb", "sqs", "stepfunctions", "batch", "s3", "kms")}
        clients["s3"].create_bucket(Bucket=LifecycleSettings().checkpoints_bucket)
        clients["key_id"] = clients["kms"].create_key(Description="webhook secrets")["KeyMetadata"]["Arn"]
        clients["keys"] = DynamoWebhookKeys(ddb, T.control, KmsSecretBox(clients["kms"], clients["key_id"]))
        yield clients


@pytest.fixture
def new_job(aws):
    def make(prompt: str = "a cat", webhook: str | None = None) -> dict:
        spec = {"workload": {"kind": "video.generate", "prompt": prompt}}
        if webhook:
            spec["webhook"] = {"url": webhook, "events": ["completed"]}
        return jobs.create_job(aws["dynamodb"], T, tenant="acme", team="t", user="u", spec=spec, clock=FakeClock())

    return make
