"""Webhook delivery records (DynamoDB); tenants' signing secrets are :mod:`gpufleet.store.webhook_keys`.

Items (keys from :mod:`gpufleet.tables`):
- jobs table, on the job's partition: ``DELIVERY#<ts>#<msg_id>#<attempt:03d>``, one per try, written
  once by the webhook sender (the API serves them through :func:`gpufleet.store.jobs.list_deliveries`).
- jobs table, on the job's partition: ``WHMSG#<msg_id>``, the claim of one event's delivery: ``claimed_by`` (the
  queue message that delivers it), ``claim_until`` (epoch s) and, once a try succeeded, ``delivered_at``.
  :meth:`DeliveryStore.claim` is a conditional update: it succeeds for the first message of an event, for
  that message's own redeliveries, and for another message once the claim's lease ran out (a dead-lettered
  chain redriven from the DLQ under a new message id), never once the event was delivered. So a duplicate
  message of the same event (a retried Notify, a redelivered stream record) is dropped while the first
  one's tries go on or after it delivered. :meth:`DeliveryStore.mark_delivered` records the success.

AWS errors become :mod:`gpufleet.errors` exceptions.

In-memory fake: :class:`gpufleet.store.fakes.deliveries.MemoryDeliveryStore`; both are held to one contract suite
(``tests/functional/store/test_store_contract_deliveries.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpufleet.store.dynamo import conditional_write, marshal, paginate, translate_errors
from gpufleet.tables import DELIVERY_PREFIX, delivery_claim_sk, delivery_sk, job_pk


class DeliveryStore(Protocol):
    def record(self, job_id: str, at: str, msg_id: str, attempt: int, fields: dict[str, Any]) -> None: ...

    def list(self, job_id: str) -> list[dict[str, Any]]: ...

    def claim(self, job_id: str, msg_id: str, owner: str, now: float, lease_s: float) -> bool: ...

    def mark_delivered(self, job_id: str, msg_id: str, now: float) -> None: ...


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

    def _claim_key(self, job_id: str, msg_id: str) -> dict[str, Any]:
        return marshal({"pk": job_pk(job_id), "sk": delivery_claim_sk(msg_id)})

    def claim(self, job_id: str, msg_id: str, owner: str, now: float, lease_s: float) -> bool:
        """Whether ``owner`` (a queue message id) may try to deliver event ``msg_id`` now (module contract); a
        success holds the event for ``lease_s`` seconds."""
        return conditional_write(
            self.client.update_item, TableName=self.jobs_table, Key=self._claim_key(job_id, msg_id),
            UpdateExpression="SET msg_id = :m, claimed_by = :me, claimed_at = :now, claim_until = :until",
            ConditionExpression="attribute_not_exists(pk) OR ((claimed_by = :me OR claim_until < :now) "
                                "AND attribute_not_exists(delivered_at))",
            ExpressionAttributeValues={":m": {"S": msg_id}, ":me": {"S": owner}, ":now": {"N": repr(float(now))},
                                       ":until": {"N": repr(float(now + lease_s))}},
        ) is not None

    def mark_delivered(self, job_id: str, msg_id: str, now: float) -> None:
        """Record that event ``msg_id`` was delivered: no message may claim it again."""
        conditional_write(
            self.client.update_item, TableName=self.jobs_table, Key=self._claim_key(job_id, msg_id),
            UpdateExpression="SET delivered_at = :now", ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":now": {"N": repr(float(now))}},
        )

    def list(self, job_id: str) -> list[dict[str, Any]]:
        """Every delivery try of ``job_id``, oldest first (items as stored)."""
        with translate_errors():
            return list(paginate(
                self.client.query,
                TableName=self.jobs_table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :d)",
                ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}, ":d": {"S": DELIVERY_PREFIX}},
            ))
