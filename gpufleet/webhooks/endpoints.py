"""Tenants' webhook endpoints (pure): what one is, which job events it receives, the per-tenant cap.

Contract:
- A :class:`WebhookEndpoint` belongs to one tenant and receives the events of that tenant's jobs whose
  kind is in ``events`` (the per-job webhook vocabulary, :data:`gpufleet.webhooks.events.KINDS`:
  ``started``, ``progress``, ``completed``) and whose labels include every ``labels`` pair (an empty
  selector matches every job), while ``enabled``.
- :func:`matches` is that filter; :func:`targets` picks the matching endpoints of a job event.
- A tenant has at most :data:`MAX_ENDPOINTS` endpoints (the store enforces it with a conditional counter).
- Ids are ``we_`` + a lower-case ULID (time-ordered), made by :func:`new_endpoint_id`.
- Each (endpoint, event) delivery has its own Standard Webhooks message id, derived from the event's id
  and the endpoint id (:func:`endpoint_message_id`), so a re-queued event keeps its id per endpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.ids import ulid

MAX_ENDPOINTS = 20
ID_PREFIX = "we_"


@dataclass(frozen=True)
class WebhookEndpoint:
    id: str
    tenant: str
    url: str
    events: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    enabled: bool = True
    created_at: str = ""
    created_by: str = ""
    updated_at: str = ""

    def as_item(self) -> dict[str, Any]:
        """The stored attributes (keys are added by the store)."""
        return {"endpoint_id": self.id, "tenant": self.tenant, "url": self.url, "events": list(self.events),
                "labels": dict(self.labels), "description": self.description, "enabled": self.enabled,
                "created_at": self.created_at, "created_by": self.created_by, "updated_at": self.updated_at}

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> WebhookEndpoint:
        return cls(id=str(item["endpoint_id"]), tenant=str(item["tenant"]), url=str(item["url"]),
                   events=tuple(str(e) for e in item.get("events") or ()),
                   labels={str(k): str(v) for k, v in (item.get("labels") or {}).items()},
                   description=str(item.get("description") or ""), enabled=bool(item.get("enabled", True)),
                   created_at=str(item.get("created_at") or ""), created_by=str(item.get("created_by") or ""),
                   updated_at=str(item.get("updated_at") or ""))

    def with_enabled(self, enabled: bool, at: str) -> WebhookEndpoint:
        return replace(self, enabled=enabled, updated_at=at)


def new_endpoint_id(now: float) -> str:
    return ID_PREFIX + ulid(int(now * 1000)).lower()


def is_endpoint_id(value: str) -> bool:
    return value.startswith(ID_PREFIX) and len(value) == len(ID_PREFIX) + 26 and value[3:].isalnum()


def matches(endpoint: WebhookEndpoint, kind: str, job_labels: Mapping[str, str]) -> bool:
    """Whether ``endpoint`` receives a ``kind`` event of a job labelled ``job_labels`` (module contract)."""
    return (endpoint.enabled and kind in endpoint.events
            and all(job_labels.get(k) == v for k, v in endpoint.labels.items()))


def targets(endpoints: Iterable[WebhookEndpoint], tenant: str, kind: str,
            job_labels: Mapping[str, str]) -> list[WebhookEndpoint]:
    """The endpoints of ``tenant`` that receive the event, in id order (another tenant's never do)."""
    return sorted((e for e in endpoints if e.tenant == tenant and matches(e, kind, job_labels)), key=lambda e: e.id)


def endpoint_message_id(event_msg_id: str, endpoint_id: str) -> str:
    """The ``webhook-id`` of the event's delivery to one endpoint (stable across re-queues)."""
    digest = hashlib.sha256(f"{event_msg_id}|{endpoint_id}".encode()).hexdigest()[:24]
    return f"msg_{digest}"
