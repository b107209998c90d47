"""Jobs-table stream consumer (MODIFY records): queue ``started`` / ``progress`` webhook events.

Thin over :func:`gpufleet.webhooks.delivery.enqueue_changes`. Needs ``GPUFLEET_WEBHOOK_QUEUE_URL``.
Wire it to the jobs stream with a filter on ``eventName = MODIFY`` (the outbox consumer takes INSERT).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.store.clients import client
from gpufleet.store.dynamo import unmarshal
from gpufleet.webhooks.delivery import enqueue_changes


@lru_cache(maxsize=1)
def _sqs():
    return client("sqs")


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    queue_url = os.environ["GPUFLEET_WEBHOOK_QUEUE_URL"]
    failures = []
    for record in event.get("Records", []):
        if record.get("eventName") != "MODIFY":
            continue
        ddb = record.get("dynamodb", {})
        try:
            enqueue_changes(_sqs(), queue_url, [(unmarshal(ddb.get("OldImage")), unmarshal(ddb.get("NewImage")))])
        except (ClientError, BotoCoreError):  # reported per record; the stream retries from it
            failures.append({"itemIdentifier": ddb.get("SequenceNumber", "")})
    return {"batchItemFailures": failures}
