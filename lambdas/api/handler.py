"""API Gateway (REST, AWS_IAM) → Lambda entry point. Thin: settings and clients are built once per container.

Settings come from ``GPUFLEET_*`` (gpufleet.api.settings) and are validated when the container
starts serving (first event); the cursor HMAC key is ``GPUFLEET_CURSOR_SECRET`` or, deployed, the
Secrets Manager secret named by ``GPUFLEET_CURSOR_SECRET_ARN``.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.app import Api
from gpufleet.api.settings import load
from gpufleet.api.wiring import build_api
from gpufleet.clock import SystemClock
from gpufleet.store.clients import client
from gpufleet.store.objects import s3_client

_api: Api | None = None
#: module attributes that live as long as the Lambda container (reset between local deployments)
__container__ = ("_api",)


def _get_api() -> Api:
    global _api
    if _api is None:
        settings = load()
        if settings.cursor_secret is None:
            secret = client("secretsmanager").get_secret_value(SecretId=settings.cursor_secret_arn)["SecretString"]
            settings = load(cursor_secret=secret)
        _api = build_api(
            settings,
            ddb=client("dynamodb"),
            s3=s3_client(),
            sfn=client("stepfunctions"),
            batch=client("batch"),
            kms=client("kms"),
            secretsmanager=client("secretsmanager"),
            sqs=client("sqs"),
            clock=SystemClock(),
        )
    return _api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _get_api().handle(event, context)
