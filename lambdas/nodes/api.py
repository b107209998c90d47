"""The node API Lambda (``/v1/node/{proxy+}`` on the REST API, ``AWS_IAM``): see :mod:`gpufleet.nodeapi.app`.

Settings from the environment (:class:`gpufleet.nodeapi.settings.NodeApiSettings`): the table and
bucket names, ``GPUFLEET_AGENT_ROLE_NAMES``, ``GPUFLEET_NODE_JOB_ROLE_ARN``, ``GPUFLEET_EVENT_BUS`` (a node that
becomes usable or reports a GPU freed puts ``NodeReady`` there: a scheduler pass now) and ``GPUFLEET_MODEL_S3_ROOT``
(the published models every attempt session may read; set by the stack, infra/onprem.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.clock import SystemClock
from gpufleet.nodeapi.app import NodeApi
from gpufleet.nodeapi.settings import NodeApiSettings, build_api
from gpufleet.store.clients import client


@lru_cache(maxsize=1)
def _api() -> NodeApi:
    return build_api(NodeApiSettings.load(), dynamodb=client("dynamodb"), stepfunctions=client("stepfunctions"),
                     sts=client("sts"), clock=SystemClock(), events=client("events"))


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return _api().handle(event, context)
