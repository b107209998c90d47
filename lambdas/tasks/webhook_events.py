"""Jobs-table stream consumer (MODIFY records): queue ``started`` / ``progress`` webhook events.

Thin over :func:`gpufleet.webhooks.delivery.enqueue_changes` (the job's own webhook and its tenant's matching
endpoints, read from the control table). Needs ``GPUFLEET_WEBHOOK_QUEUE_URL`` (:class:`EventsSettings`, loaded
once per container with the clients).
Wire it to the jobs stream with a filter on ``eventName = MODIFY`` (the outbox consumer takes INSERT).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.clock import SystemClock
from gpufleet.errors import GpufleetError
from gpufleet.settings import StorageSettings
from gpufleet.store.clients import client
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints
from gpufleet.webhooks.delivery import enqueue_changes


class EventsSettings(StorageSettings):
    webhook_queue_url: str


@lru_cache(maxsize=1)
def _sqs():
    return client("sqs")


@lru_cache(maxsize=1)
def _endpoints() -> DynamoWebhookEndpoints:
    return DynamoWebhookEndpoints(client("dynamodb"), _settings().control_table)


@lru_cache(maxsize=1)
def _settings() -> EventsSettings:
    return EventsSettings.load()


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    queue_url = _settings().webhook_queue_url
    clock = SystemClock()
    failures = []
    for record in event.get("Records", []):
        if record.get("eventName") != "MODIFY":
            continue
        ddb = record.get("dynamodb", {})
        try:
            enqueue_changes(_sqs(), queue_url, [(unmarshal(ddb.get("OldImage")), unmarshal(ddb.get("NewImage")))],
                            clock=clock, endpoints=_endpoints())
        except (ClientError, BotoCoreError, GpufleetError):  # reported per record; the stream retries from it
            failures.append({"itemIdentifier": ddb.get("SequenceNumber", "")})
    return {"batchItemFailures": failures}
