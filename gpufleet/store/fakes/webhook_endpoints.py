"""In-memory :class:`~gpufleet.store.webhook_endpoints.WebhookEndpointStore` (the same items, conditions and errors)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import Conflict
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.webhook_endpoints import limit_reached, not_found
from gpufleet.tables import (
    WEBHOOK_ENDPOINT_COUNT_SK,
    WEBHOOK_ENDPOINT_SK_PREFIX,
    webhook_endpoint_sk,
    webhook_endpoints_pk,
)
from gpufleet.webhooks.endpoints import MAX_ENDPOINTS, WebhookEndpoint


@dataclass
class MemoryWebhookEndpoints:
    db: MemoryDatabase
    table: str = "control"

    def _items(self, tenant: str) -> list[dict]:
        pk = webhook_endpoints_pk(tenant)
        with self.db.lock:
            rows = [dict(v) for (p, s), v in self.db.table(self.table).items()
                    if p == pk and s.startswith(WEBHOOK_ENDPOINT_SK_PREFIX)]
        return sorted(rows, key=lambda i: i["sk"])

    def create(self, endpoint: WebhookEndpoint, cap: int = MAX_ENDPOINTS) -> None:
        pk = webhook_endpoints_pk(endpoint.tenant)
        with self.db.lock:
            count = self.db.get(self.table, (pk, WEBHOOK_ENDPOINT_COUNT_SK)) or {"pk": pk, "sk": WEBHOOK_ENDPOINT_COUNT_SK,
                                                                               "n": 0}
            if count["n"] >= cap:
                raise limit_reached(cap)
            if self.db.get(self.table, (pk, webhook_endpoint_sk(endpoint.id))) is not None:
                raise Conflict(f"webhook endpoint {endpoint.id} exists")
            self.db.put(self.table, {**count, "n": count["n"] + 1})
            self.db.put(self.table, {"pk": pk, "sk": webhook_endpoint_sk(endpoint.id), **endpoint.as_item()})

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpoint:
        item = self.db.get(self.table, (webhook_endpoints_pk(tenant), webhook_endpoint_sk(endpoint_id)))
        if item is None:
            raise not_found(endpoint_id)
        return WebhookEndpoint.from_item(item)

    def list(self, tenant: str, limit: int, after: str | None = None) -> tuple[list[WebhookEndpoint], str | None]:
        rows = self._items(tenant)
        if after:
            rows = [r for r in rows if r["sk"] > webhook_endpoint_sk(after)]
        page = [WebhookEndpoint.from_item(r) for r in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    def all(self, tenant: str) -> list[WebhookEndpoint]:
        return [WebhookEndpoint.from_item(r) for r in self._items(tenant)]

    def set_enabled(self, tenant: str, endpoint_id: str, enabled: bool, at: str) -> WebhookEndpoint:
        with self.db.lock:
            found = self.get(tenant, endpoint_id).with_enabled(enabled, at)
            self.db.put(self.table, {"pk": webhook_endpoints_pk(tenant), "sk": webhook_endpoint_sk(endpoint_id),
                                     **found.as_item()})
        return found

    def delete(self, tenant: str, endpoint_id: str) -> None:
        pk = webhook_endpoints_pk(tenant)
        with self.db.lock:
            self.get(tenant, endpoint_id)
            self.db.delete(self.table, (pk, webhook_endpoint_sk(endpoint_id)))
            count = self.db.get(self.table, (pk, WEBHOOK_ENDPOINT_COUNT_SK))
            if count:
                self.db.put(self.table, {**count, "n": max(0, count["n"] - 1)})
