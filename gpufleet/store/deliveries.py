"""Webhook delivery records (DynamoDB); tenants' signing secrets are :mod:`gpufleet.store.webhook_keys`.

Items (keys from :mod:`gpufleet.tables`):
- jobs table, on the job's partition: ``DELIVERY#<ts>#<msg_id>#<attempt:03d>``, one per try, written
  once by the webhook sender (the API serves them through :func:`gpufleet.store.jobs.list_deliveries`).
- jobs table, on the job's partition: ``WHMSG#<msg_id>``, the claim of one event's delivery (``claimed_by``: the
  queue message that delivers it). :meth:`DeliveryStore.claim` is a conditional put: the first message of an
  event claims it, and only that message (its redeliveries included) may deliver it; a duplicate message of
  the same event (a retried Notify, a redelivered stream record) finds it claimed and is dropped.

AWS errors become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.store.dynamo import conditional_write, marshal, paginate, translate_errors
from gpufleet.tables import DELIVERY_PREFIX, delivery_claim_sk, delivery_sk, job_pk


class DeliveryStore(Protocol):
    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None: ...

    def list(self, job_id: str) -> list[dict[str, Any]]: ...

    def claim(self, job_id: str, msg_id: str, owner: str, at: str) -> bool: ...


class DynamoDeliveryStore:
    """:class:`DeliveryStore` over the jobs table."""

    def __init__(self, client, jobs_table: str, control_table: str = "") -> None:
        self.client = client
        self.jobs_table = jobs_table

    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None:
        """Write one delivery try of ``job_id`` (``fields`` are its attributes; None values dropped)."""
        item = {"pk": job_pk(job_id), "sk": delivery_sk(at, msg_id, attempt), **fields}
        # written once: a try already logged under this key (a redelivered message) is kept as it was
        conditional_write(self.client.put_item, TableName=self.jobs_table, Item=marshal(item),
                          ConditionExpression="attribute_not_exists(pk)")

    def claim(self, job_id: str, msg_id: str, owner: str, at: str) -> bool:
        """Whether ``owner`` (a queue message id) delivers event ``msg_id``: it claimed it now or before."""
        item = {"pk": job_pk(job_id), "sk": delivery_claim_sk(msg_id), "msg_id": msg_id, "claimed_by": owner, "at": at}
        return conditional_write(
            self.client.put_item, TableName=self.jobs_table, Item=marshal(item),
            ConditionExpression="attribute_not_exists(pk) OR claimed_by = :me",
            ExpressionAttributeValues={":me": {"S": owner}},
        ) is not None

    def list(self, job_id: str) -> list[dict[str, Any]]:
        """Every delivery try of ``job_id``, oldest first (items as stored)."""
        with translate_errors():
            return list(paginate(
                self.client.query,
                TableName=self.jobs_table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :d)",
                ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}, ":d": {"S": DELIVERY_PREFIX}},
            ))
