"""Tenants' webhook endpoints on the control table (:mod:`gpufleet.webhooks.endpoints` is the domain).

Items (keys from :mod:`gpufleet.tables`): ``WHEP#<tenant>`` / ``EP#<endpoint_id>`` holds one endpoint;
``WHEP#<tenant>`` / ``COUNT`` holds ``n``, how many the tenant has.

Contract:
- :meth:`WebhookEndpointStore.create` puts the endpoint and counts it in one transaction: the count's
  condition (``n < cap``) refuses the ``cap + 1``-th with :class:`~gpufleet.errors.LimitReached`,
  however many creations race; the put's condition (no such item) makes a repeated id a Conflict.
- :meth:`WebhookEndpointStore.delete` removes the endpoint and uncounts it in one transaction
  (:class:`~gpufleet.errors.NotFound` when the tenant has no such endpoint).
- :meth:`WebhookEndpointStore.set_enabled` is a conditional update of an existing endpoint (NotFound
  otherwise); :meth:`get` reads one (NotFound); :meth:`list` pages through a tenant's endpoints in id
  order (``after``: the last id of the previous page) and :meth:`all` returns every one of them.
- Every lookup is keyed by the caller's tenant, so another tenant's endpoint id is simply not found.
- AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import Conflict, LimitReached, NotFound
from gpufleet.store.dynamo import (
    cancellation_reasons,
    conditional_write,
    error_code,
    marshal,
    marshal_value,
    paginate,
    reraise,
    translate_errors,
    unmarshal,
)
from gpufleet.tables import (
    WEBHOOK_ENDPOINT_COUNT_SK,
    WEBHOOK_ENDPOINT_SK_PREFIX,
    webhook_endpoint_sk,
    webhook_endpoints_pk,
)
from gpufleet.webhooks.endpoints import MAX_ENDPOINTS, WebhookEndpoint


class WebhookEndpointStore(Protocol):
    def create(self, endpoint: WebhookEndpoint, cap: int = MAX_ENDPOINTS) -> None: ...

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpoint: ...

    def list(self, tenant: str, limit: int, after: str | None = None) -> tuple[list[WebhookEndpoint], str | None]: ...

    def all(self, tenant: str) -> list[WebhookEndpoint]: ...

    def set_enabled(self, tenant: str, endpoint_id: str, enabled: bool, at: str) -> WebhookEndpoint: ...

    def delete(self, tenant: str, endpoint_id: str) -> None: ...


def limit_reached(cap: int) -> LimitReached:
    return LimitReached(f"a tenant may have at most {cap} webhook endpoints; delete one first", limit=cap)


def not_found(endpoint_id: str) -> NotFound:
    return NotFound(f"no webhook endpoint {endpoint_id}")


class DynamoWebhookEndpoints:
    """:class:`WebhookEndpointStore` on the control table."""

    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    @staticmethod
    def _key(tenant: str, sk: str) -> dict[str, Any]:
        return marshal({"pk": webhook_endpoints_pk(tenant), "sk": sk})

    def create(self, endpoint: WebhookEndpoint, cap: int = MAX_ENDPOINTS) -> None:
        pk = webhook_endpoints_pk(endpoint.tenant)
        item = {"pk": pk, "sk": webhook_endpoint_sk(endpoint.id), **endpoint.as_item()}
        try:
            self.client.transact_write_items(TransactItems=[
                {"Update": {"TableName": self.table, "Key": self._key(endpoint.tenant, WEBHOOK_ENDPOINT_COUNT_SK),
                            "UpdateExpression": "SET n = if_not_exists(n, :z) + :one",
                            "ConditionExpression": "attribute_not_exists(n) OR n < :cap",
                            "ExpressionAttributeValues": {":z": {"N": "0"}, ":one": {"N": "1"},
                                                          ":cap": {"N": str(cap)}}}},
                {"Put": {"TableName": self.table, "Item": marshal(item),
                         "ConditionExpression": "attribute_not_exists(pk)"}},
            ])
        except ClientError as err:
            if error_code(err) != "TransactionCanceledException":
                reraise(err)
            reasons = cancellation_reasons(err)
            if reasons[:1] == ["ConditionalCheckFailed"]:
                raise limit_reached(cap) from err
            if "ConditionalCheckFailed" in reasons:
                raise Conflict(f"webhook endpoint {endpoint.id} exists") from err
            reraise(err)

    def get(self, tenant: str, endpoint_id: str) -> WebhookEndpoint:
        with translate_errors():
            got = self.client.get_item(TableName=self.table, Key=self._key(tenant, webhook_endpoint_sk(endpoint_id)),
                                       ConsistentRead=True)
        item = unmarshal(got.get("Item"))
        if not item:
            raise not_found(endpoint_id)
        return WebhookEndpoint.from_item(item)

    def list(self, tenant: str, limit: int, after: str | None = None) -> tuple[list[WebhookEndpoint], str | None]:
        kwargs: dict[str, Any] = {
            "TableName": self.table, "Limit": limit + 1,  # one more: is there a next page
            "KeyConditionExpression": "pk = :p AND begins_with(sk, :e)",
            "ExpressionAttributeValues": {":p": marshal_value(webhook_endpoints_pk(tenant)),
                                          ":e": marshal_value(WEBHOOK_ENDPOINT_SK_PREFIX)},
        }
        if after:
            kwargs["ExclusiveStartKey"] = self._key(tenant, webhook_endpoint_sk(after))
        with translate_errors():
            resp = self.client.query(**kwargs)
        found = [WebhookEndpoint.from_item(unmarshal(i) or {}) for i in resp.get("Items", [])]
        return found[:limit], (found[limit - 1].id if len(found) > limit else None)

    def all(self, tenant: str) -> list[WebhookEndpoint]:
        with translate_errors():
            items = list(paginate(
                self.client.query, TableName=self.table,
                KeyConditionExpression="pk = :p AND begins_with(sk, :e)",
                ExpressionAttributeValues={":p": marshal_value(webhook_endpoints_pk(tenant)),
                                           ":e": marshal_value(WEBHOOK_ENDPOINT_SK_PREFIX)}))
        return [WebhookEndpoint.from_item(i) for i in items]

    def set_enabled(self, tenant: str, endpoint_id: str, enabled: bool, at: str) -> WebhookEndpoint:
        resp = conditional_write(
            self.client.update_item, TableName=self.table, Key=self._key(tenant, webhook_endpoint_sk(endpoint_id)),
            UpdateExpression="SET enabled = :e, updated_at = :u", ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":e": {"BOOL": enabled}, ":u": {"S": at}}, ReturnValues="ALL_NEW")
        if resp is None:
            raise not_found(endpoint_id)
        return WebhookEndpoint.from_item(unmarshal(resp["Attributes"]) or {})

    def delete(self, tenant: str, endpoint_id: str) -> None:
        try:
            self.client.transact_write_items(TransactItems=[
                {"Delete": {"TableName": self.table, "Key": self._key(tenant, webhook_endpoint_sk(endpoint_id)),
                            "ConditionExpression": "attribute_exists(pk)"}},
                {"Update": {"TableName": self.table, "Key": self._key(tenant, WEBHOOK_ENDPOINT_COUNT_SK),
                            "UpdateExpression": "SET n = n - :one", "ConditionExpression": "n > :z",
                            "ExpressionAttributeValues": {":z": {"N": "0"}, ":one": {"N": "1"}}}},
            ])
        except ClientError as err:
            if error_code(err) != "TransactionCanceledException":
                reraise(err)
            if cancellation_reasons(err)[:1] == ["ConditionalCheckFailed"]:
                raise not_found(endpoint_id) from err
            reraise(err)
