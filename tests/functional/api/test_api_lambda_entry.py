"""The Lambda entry point and its settings: env validated at start-up, explicit arguments win."""

from __future__ import annotations

import json

import boto3
import pytest
from api_helpers import ALICE, REGION, VIDEO, register_principals

from gpufleet.api.settings import load
from gpufleet.devstack.gateway import build_event
from gpufleet.errors import ConfigError


def test_settings_from_env_explicit_wins_and_invalid_fails(monkeypatch):
    monkeypatch.setenv("GPUFLEET_CURSOR_SECRET", "from-env-0123456789")
    monkeypatch.setenv("GPUFLEET_QUEUED_JOBS_PER_USER", "7")
    s = load(queued_jobs_per_user=3)
    assert s.queued_jobs_per_user == 3 and s.cursor_key == b"from-env-0123456789"
    monkeypatch.setenv("GPUFLEET_QUEUED_JOBS_PER_USER", "0")
    with pytest.raises(ConfigError, match="queued_jobs_per_user"):
        load()
    monkeypatch.delenv("GPUFLEET_QUEUED_JOBS_PER_USER")
    monkeypatch.delenv("GPUFLEET_CURSOR_SECRET")
    with pytest.raises(ConfigError, match="CURSOR_SECRET"):
        load()
    with pytest.raises(ConfigError):
        load(presign_ttl_s=3600)  # presigned links never outlive 15 minutes


def test_lambda_handler_reads_the_cursor_secret_from_secrets_manager(ddb, s3, tables, monkeypatch):
    register_principals(ddb, tables.control)
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="gpufleet/cursor", SecretString="from-secrets-manager-0123"
    )["ARN"]
    monkeypatch.setenv("GPUFLEET_CURSOR_SECRET_ARN", arn)
    monkeypatch.delenv("GPUFLEET_CURSOR_SECRET", raising=False)
    from lambdas.api import handler as entry

    monkeypatch.setattr(entry, "_api", None)
    hdrs = {"Idempotency-Key": "lambda-1", "Content-Type": "application/json"}
    resp = entry.handler(build_event("POST", "/v1/jobs", hdrs, json.dumps(VIDEO).encode(), user_arn=ALICE), None)
    assert resp["statusCode"] == 202
    page = entry.handler(build_event("GET", "/v1/jobs?limit=1", {}, b"", user_arn=ALICE), None)
    assert json.loads(page["body"])["jobs"][0]["job_id"] == json.loads(resp["body"])["job_id"]
    assert entry._api.deps.settings.cursor_key == b"from-secrets-manager-0123"
