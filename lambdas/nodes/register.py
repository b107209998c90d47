"""Node registration Lambda (``POST /v1/nodes``, IAM-authenticated and admin only, or a direct invoke).

An operator binds a node to its pool, site and inventory here; the node never declares them itself
(its heartbeats, through the node API, can only report liveness within this registration:
:mod:`gpufleet.nodeapi.liveness`).

Input (the API Gateway proxy body, or the event itself for a direct invoke — which IAM already limits
to whoever may invoke this function, i.e. operators): ``{"node_id", "pool", "site", "labels",
"gpu_type", "gpus", "gpu_memory_gb", "cpu_milli", "memory_mib"}`` (``node_id`` and ``pool`` required).
Through the API the caller's IAM principal (``requestContext.identity.userArn``) must be registered
with ``admin: true`` (:mod:`gpufleet.store.principals`); anyone else gets 403 and nothing is created.
Output: ``{"node_id", "queue_url", "dlq_url", "signals_url", "pool", "site", "agent"}`` (201 through the API;
``agent``: the ``[agent]`` settings this deployment gives the node's agent, :func:`agent_settings`). It
creates the node's queue, its DLQ and its signal queue (cancel nudges: :mod:`gpufleet.store.queues`) (``GPUFLEET_NODE_QUEUE_PREFIX``, ``GPUFLEET_NODE_QUEUE_MAX_RECEIVES``, visibility
twice ``GPUFLEET_HEARTBEAT_SECONDS``) and writes the registration item (``NODE#<id>`` /
``REGISTRATION`` in ``GPUFLEET_CONTROL_TABLE``) with its audit record (``node.register``, in one transaction);
registering again rebinds (an operator's decision).
Settings (:class:`RegisterSettings`, loaded once per container) come from the environment the on-prem
construct sets.

Node ids match :data:`gpufleet.nodeapi.liveness.NODE_ID_PATTERN`: 2-42 characters of ``a-z0-9-``,
starting and ending with a letter or digit, and never ending in ``-dlq``: a node's queue is
``<prefix><node_id>`` and its dead-letter queue ``<prefix><node_id>-dlq``, so a node ``X-dlq`` would
otherwise own node ``X``'s dead-letter queue (the agent role grants ``<prefix><certificate CN>``; the
Roles Anywhere trust policy refuses such CNs too, infra/onprem.py).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from gpufleet.clock import SystemClock, iso
from gpufleet.errors import GpufleetError, NotAllowed, ValidationFailed
from gpufleet.ids import ulid
from gpufleet.nodeapi.liveness import NODE_ID_PATTERN, Registration
from gpufleet.settings import StorageSettings
from gpufleet.store.admin import AuditRecord
from gpufleet.store.clients import client
from gpufleet.store.nodes import DynamoNodeStore
from gpufleet.store.principals import resolve
from gpufleet.store.queues import ensure_node_queue

__all__ = ["NODE_ID_PATTERN", "RegisterSettings", "handler", "validate_node_id"]


class RegisterSettings(StorageSettings):
    node_queue_prefix: str = "gpufleet-node-"
    node_queue_max_receives: int = 5
    heartbeat_seconds: int = 30


@lru_cache(maxsize=1)
def _settings() -> RegisterSettings:
    return RegisterSettings.load()


def validate_node_id(node_id: str) -> str:
    if not NODE_ID_PATTERN.match(node_id):
        raise ValidationFailed(
            "node_id must be 2-42 characters of a-z, 0-9 and '-', start and end with a letter or digit, "
            "and not end in -dlq", field="node_id")
    return node_id


def _request(event: dict[str, Any]) -> tuple[dict[str, Any], str | None, bool]:
    """(body, caller ARN or None, via the API?)."""
    if "httpMethod" in event or "requestContext" in event:
        try:
            body = json.loads(event.get("body") or "{}")
        except json.JSONDecodeError:
            raise ValidationFailed("body must be JSON")
        if not isinstance(body, dict):
            raise ValidationFailed("body must be a JSON object")
        identity = ((event.get("requestContext") or {}).get("identity")) or {}
        return body, identity.get("userArn"), True
    return dict(event), None, False


def _register(body: dict[str, Any], caller: str | None, via_api: bool) -> dict[str, Any]:
    node_id = validate_node_id(str(body.get("node_id", "")))
    if not body.get("pool"):
        raise ValidationFailed("pool is required: an operator binds the node to its pool", field="pool")
    ddb = client("dynamodb")
    settings = _settings()
    if via_api:
        principal = resolve(ddb, settings.control_table, caller)
        if not principal.admin:
            raise NotAllowed("only an operator (an admin principal) may register nodes")
    queue = ensure_node_queue(
        client("sqs"),
        node_id,
        prefix=settings.node_queue_prefix,
        max_receives=settings.node_queue_max_receives,
        visibility_timeout_s=2 * settings.heartbeat_seconds,
    )
    try:
        reg = Registration.model_validate({
            **{k: v for k, v in body.items() if k not in ("queue_url", "registered_by", "registered_at")},
            "queue_url": queue.queue_url, "registered_by": caller or "direct-invoke",
            "registered_at": iso(SystemClock().now()),
        })
    except ValidationError as err:
        raise ValidationFailed(f"invalid registration: {err.errors(include_url=False, include_input=False)}")
    audit = AuditRecord(at=reg.registered_at, id=ulid().lower(), actor=reg.registered_by, action="node.register",
                        target=f"registration {reg.node_id}", detail={"pool": reg.pool, "site": reg.site,
                                                                       "gpus": reg.gpus, "gpu_type": reg.gpu_type})
    DynamoNodeStore(ddb, settings.control_table).register(reg, audit)
    return {"node_id": queue.node_id, "queue_url": queue.queue_url, "dlq_url": queue.dlq_url,
            "signals_url": queue.signals_url, "pool": reg.pool, "site": reg.site,
            "agent": agent_settings(reg, queue.queue_url, queue.signals_url, settings)}


def agent_settings(reg: Registration, queue_url: str, signals_url: str, settings: RegisterSettings) -> dict[str, Any]:
    """What the node's agent configuration takes from this deployment and registration (``[agent]`` keys of
    ``agent.toml``; the node API's URL is the caller's own endpoint, which the CLI adds)."""
    return {"node_id": reg.node_id, "pool": reg.pool, "queue_url": queue_url, "signals_queue_url": signals_url,
            "region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "jobs_table": settings.jobs_table, "control_table": settings.control_table,
            "labels": reg.bound_labels()}


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    via_api = "httpMethod" in (event or {}) or "requestContext" in (event or {})
    try:
        body, caller, via_api = _request(event or {})
        result = _register(body, caller, via_api)
    except GpufleetError as err:
        if not via_api:
            raise
        return {
            "statusCode": err.status,
            "headers": {"content-type": "application/problem+json"},
            "body": json.dumps(err.problem("/v1/nodes")),
        }
    if via_api:
        return {"statusCode": 201, "headers": {"content-type": "application/json"}, "body": json.dumps(result)}
    return result
