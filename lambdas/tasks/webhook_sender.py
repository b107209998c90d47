"""Webhook sender: SQS-triggered; delivers each queued event (see :mod:`gpufleet.webhooks.delivery`).

Failed deliveries are reported as batch item failures after their visibility was set to the next
backoff step, so SQS redelivers them then; the queue's redrive policy moves exhausted ones to the DLQ.
A target refused by the webhook URL policy (:mod:`gpufleet.webhooks.urlpolicy`; private targets
allowed only when ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE`` is true) is a permanent failure: logged as
dead-lettered with its reason and not handed back to SQS, so it is never retried.
A message of a tenant's webhook endpoint is dropped (logged, not retried) when the endpoint was deleted or
disabled meanwhile; a duplicate message of an event another message claimed is dropped unsent (the SQS
message id is the claim). Deliveries are signed with the tenant's live secrets, KMS-sealed on its tenant item (``GPUFLEET_WEBHOOK_KEY_ID``,
:mod:`gpufleet.store.webhook_keys`). Settings (:class:`SenderSettings`), clients and the clock are built once per
container.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import Field, field_validator

from gpufleet.clock import SystemClock
from gpufleet.settings import StorageSettings
from gpufleet.store.clients import client
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox
from gpufleet.webhooks.delivery import deliver_message
from gpufleet.webhooks.urlpolicy import ENV_ALLOW_PRIVATE, allow_private_from_env


class SenderSettings(StorageSettings):
    """``GPUFLEET_*`` of the sender; ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE`` is true for true/1/yes/on only."""

    #: the webhook queue (empty: derived from each record's ``eventSourceARN``)
    webhook_queue_url: str = ""
    webhook_allow_private: bool = False
    #: the KMS key that seals tenants' signing secrets (gpufleet.store.webhook_keys); required
    webhook_key_id: str = Field(min_length=1)

    @field_validator("webhook_allow_private", mode="before")
    @classmethod
    def _flag(cls, v: Any) -> Any:
        return allow_private_from_env({ENV_ALLOW_PRIVATE: v}) if isinstance(v, str) else v


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any, Any]:
    return client("dynamodb"), client("sqs"), client("kms")


@lru_cache(maxsize=1)
def _settings() -> SenderSettings:
    return SenderSettings.load()


def queue_url_from_arn(arn: str, sqs) -> str:
    name = arn.rsplit(":", 1)[-1]
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    ddb, sqs, kms = _clients()
    settings = _settings()
    keys = DynamoWebhookKeys(ddb, settings.control_table, KmsSecretBox(kms, settings.webhook_key_id))
    endpoints = DynamoWebhookEndpoints(ddb, settings.control_table)
    tables = settings.tables
    queue_url = settings.webhook_queue_url
    allow_private = settings.webhook_allow_private
    failures = []
    for record in event.get("Records", []):
        url = queue_url or queue_url_from_arn(record["eventSourceARN"], sqs)
        result = deliver_message(
            record["body"],
            int(record.get("attributes", {}).get("ApproximateReceiveCount", "1")),
            ddb=ddb,
            jobs_table=tables.jobs,
            control_table=tables.control,
            keys=keys,
            sqs=sqs,
            queue_url=url,
            receipt_handle=record.get("receiptHandle"),
            allow_private=allow_private,
            clock=SystemClock(),
            endpoints=endpoints,
            claim=record.get("messageId"),
        )
        if not result.delivered and not result.refused and not result.duplicate:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
