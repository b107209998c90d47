"""API Gateway (REST, AWS_IAM) ``POST /v1/provenance/lookup`` → its own Lambda: the watermark detector (seconds of
CPU on a large frame) runs apart from the API function, with the only role that reads the deployment's watermark
keys besides finalize's (:func:`gpufleet.api.wiring.build_lookup_api`; every other route is a 404 here).

Settings are the API's (``GPUFLEET_*``, :func:`gpufleet.api.settings.load`); the function lists nothing, so its
list-cursor key is a random one of its own container rather than the API's secret, which its role cannot read.
"""

from __future__ import annotations

import secrets
from typing import Any

from gpufleet.api.app import Api
from gpufleet.api.settings import load
from gpufleet.api.wiring import build_lookup_api
from gpufleet.clock import SystemClock
from gpufleet.store.clients import client
from gpufleet.store.objects import s3_client

_api: Api | None = None
#: module attributes that live as long as the Lambda container (reset between local deployments)
__container__ = ("_api",)


def _get_api() -> Api:
    global _api
    if _api is None:
        _api = build_lookup_api(load(cursor_secret=secrets.token_urlsafe(32)), ddb=client("dynamodb"),
                                s3=s3_client(), secretsmanager=client("secretsmanager"), clock=SystemClock())
    return _api


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _get_api().handle(event, context)
