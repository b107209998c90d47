"""API Gateway (REST, AWS_IAM) → Lambda entry point. Thin: settings and clients are built once per container."""

from __future__ import annotations

from typing import Any

from gpufleet.api.app import Api
from gpufleet.api.service import Deps
from gpufleet.api.settings import load
from gpufleet.store.dynamo import client
from gpufleet.store.objects import s3_client

_api: Api | None = None


def _get_api() -> Api:
    global _api
    if _api is None:
        _api = Api(
            Deps(
                settings=load(),
                ddb=client("dynamodb"),
                s3=s3_client(),
                sfn=client("stepfunctions"),
                batch=client("batch"),
            )
        )
    return _api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _get_api().handle(event, context)
