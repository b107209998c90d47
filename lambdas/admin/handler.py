"""The administration API Lambda (``/v1/admin/{proxy+}`` on the REST API, ``AWS_IAM``): see
:mod:`gpufleet.adminapi.app`. Settings from the environment (:class:`gpufleet.adminapi.settings.AdminApiSettings`)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.adminapi.app import AdminApi
from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
from gpufleet.clock import SystemClock
from gpufleet.store.clients import client


@lru_cache(maxsize=1)
def _api() -> AdminApi:
    return build_admin_api(AdminApiSettings.load(), dynamodb=client("dynamodb"), clock=SystemClock(), s3=client("s3"))


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return _api().handle(event, context)
