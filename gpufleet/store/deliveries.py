"""Webhook delivery records and tenant webhook secrets (DynamoDB).

Items (keys from :mod:`gpufleet.tables`):
- jobs table, on the job's partition: ``DELIVERY#<ts>#<msg_id>#<attempt:03d>``, one per try, written
  once by the webhook sender (the API serves them through :func:`gpufleet.store.jobs.list_deliveries`).
- control table: the tenant item ``TENANT#<tenant>`` / ``TENANT`` holds ``webhook_secret``.

Contract: :meth:`DeliveryStore.create_secret` stores a secret only if the tenant has none (a
conditional update, so two first deliveries racing keep one secret) and says whether it did.
AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.store.dynamo import conditional_write, marshal, paginate, translate_errors, unmarshal
from gpufleet.tables import DELIVERY_PREFIX, TENANT_SK, delivery_sk, job_pk, tenant_pk


class DeliveryStore(Protocol):
    def secret(self, tenant: str) -> str | None: ...

    def create_secret(self, tenant: str, secret: str) -> bool: ...

    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None: ...

    def list(self, job_id: str) -> list[dict[str, Any]]: ...


class DynamoDeliveryStore:
    """:class:`DeliveryStore` over the jobs table (delivery records) and the control table (secrets)."""

    def __init__(self, client, jobs_table: str, control_table: str) -> None:
        self.client = client
        self.jobs_table = jobs_table
        self.control_table = control_table

    def _tenant_key(self, tenant: str) -> dict[str, Any]:
        return marshal({"pk": tenant_pk(tenant), "sk": TENANT_SK})

    def secret(self, tenant: str) -> str | None:
        """The tenant's webhook secret, None when it has none yet."""
        with translate_errors():
            got = self.client.get_item(TableName=self.control_table, Key=self._tenant_key(tenant), ConsistentRead=True)
        item = unmarshal(got.get("Item")) or {}
        return str(item["webhook_secret"]) if item.get("webhook_secret") else None

    def create_secret(self, tenant: str, secret: str) -> bool:
        """Store ``secret`` if the tenant has none; False when another writer stored one first."""
        return conditional_write(
            self.client.update_item,
            TableName=self.control_table,
            Key=self._tenant_key(tenant),
            UpdateExpression="SET webhook_secret = :s",
            ConditionExpression="attribute_not_exists(webhook_secret)",
            ExpressionAttributeValues={":s": {"S": secret}},
        ) is not None

    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None:
        """Write one delivery try of ``job_id`` (``fields`` are its attributes; None values dropped)."""
        item = {"pk": job_pk(job_id), "sk": delivery_sk(at, msg_id, attempt), **fields}
        with translate_errors():
            self.client.put_item(TableName=self.jobs_table, Item=marshal(item))

    def list(self, job_id: str) -> list[dict[str, Any]]:
        """Every delivery try of ``job_id``, oldest first (items as stored)."""
        with translate_errors():
            return list(paginate(
                self.client.query,
                TableName=self.jobs_table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :d)",
                ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}, ":d": {"S": DELIVERY_PREFIX}},
            ))
