"""Node registration Lambda (``POST /v1/nodes``, IAM-authenticated, or a direct invoke).

Input: ``{"node_id": "..."}`` as the API Gateway proxy body or as the event
itself. Output: ``{"node_id", "queue_url", "dlq_url"}`` (201 through the API).
Settings (:class:`RegisterSettings`, loaded once per container) come from the environment the
on-prem construct sets: ``GPUFLEET_NODE_QUEUE_PREFIX``, ``GPUFLEET_NODE_QUEUE_MAX_RECEIVES``,
``GPUFLEET_HEARTBEAT_SECONDS`` (the visibility timeout is twice the heartbeat).

Node ids match :data:`NODE_ID_PATTERN`: 2-42 characters of ``a-z0-9-``, starting and ending with a
letter or digit, and never ending in ``-dlq``: a node's queue is ``<prefix><node_id>`` and its
dead-letter queue ``<prefix><node_id>-dlq``, so a node ``X-dlq`` would otherwise own node ``X``'s
dead-letter queue (the agent role grants ``<prefix><certificate CN>``; the Roles Anywhere trust
policy refuses such CNs too, infra/onprem.py).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from gpufleet.errors import GpufleetError, ValidationFailed
from gpufleet.settings import Settings
from gpufleet.store.clients import client
from gpufleet.store.queues import ensure_node_queue

NODE_ID_PATTERN = re.compile(r"^(?!.*-dlq$)[a-z0-9][a-z0-9-]{0,40}[a-z0-9]$")


def validate_node_id(node_id: str) -> str:
    if not NODE_ID_PATTERN.match(node_id):
        raise ValidationFailed(
            "node_id must be 2-42 characters of a-z, 0-9 and '-', start and end with a letter or digit, "
            "and not end in -dlq", field="node_id")
    return node_id


class RegisterSettings(Settings):
    node_queue_prefix: str = "gpufleet-node-"
    node_queue_max_receives: int = 5
    heartbeat_seconds: int = 30


@lru_cache(maxsize=1)
def _settings() -> RegisterSettings:
    return RegisterSettings.load()


def _node_id(event: dict[str, Any]) -> tuple[str, bool]:
    if "httpMethod" in event or "requestContext" in event:
        try:
            body = json.loads(event.get("body") or "{}")
        except json.JSONDecodeError:
            raise ValidationFailed("body must be JSON")
        return str(body.get("node_id", "")), True
    return str(event.get("node_id", "")), False


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    node_id, via_api = _node_id(event or {})
    settings = _settings()
    try:
        validate_node_id(node_id)
        queue = ensure_node_queue(
            client("sqs"),
            node_id,
            prefix=settings.node_queue_prefix,
            max_receives=settings.node_queue_max_receives,
            visibility_timeout_s=2 * settings.heartbeat_seconds,
        )
    except GpufleetError as err:
        if not via_api:
            raise
        return {
            "statusCode": err.status,
            "headers": {"content-type": "application/problem+json"},
            "body": json.dumps(err.problem("/v1/nodes")),
        }
    result = {"node_id": queue.node_id, "queue_url": queue.queue_url, "dlq_url": queue.dlq_url}
    if via_api:
        return {"statusCode": 201, "headers": {"content-type": "application/json"}, "body": json.dumps(result)}
    return result
