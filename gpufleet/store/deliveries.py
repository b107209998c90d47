"""Webhook delivery records (DynamoDB); tenants' signing secrets are :mod:`gpufleet.store.webhook_keys`.

Items (keys from :mod:`gpufleet.tables`):
- jobs table, on the job's partition: ``DELIVERY#<ts>#<msg_id>#<attempt:03d>``, one per try, written
  once by the webhook sender (the API serves them through :func:`gpufleet.store.jobs.list_deliveries`).

AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.store.dynamo import marshal, paginate, translate_errors
from gpufleet.tables import DELIVERY_PREFIX, delivery_sk, job_pk


class DeliveryStore(Protocol):
    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None: ...

    def list(self, job_id: str) -> list[dict[str, Any]]: ...


class DynamoDeliveryStore:
    """:class:`DeliveryStore` over the jobs table."""

    def __init__(self, client, jobs_table: str, control_table: str = "") -> None:
        self.client = client
        self.jobs_table = jobs_table

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
