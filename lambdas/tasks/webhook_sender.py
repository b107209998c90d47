"""Webhook sender: SQS-triggered; delivers each queued event (see :mod:`gpufleet.webhooks.delivery`).

Failed deliveries are reported as batch item failures after their visibility was set to the next
backoff step, so SQS redelivers them then; the queue's redrive policy moves exhausted ones to the DLQ.
A target refused by the webhook URL policy (:mod:`gpufleet.webhooks.urlpolicy`; private targets
allowed only when ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE`` is true) is a permanent failure: logged as
dead-lettered with its reason and not handed back to SQS, so it is never retried.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from gpufleet.store.clients import client
from gpufleet.tables import TableNames
from gpufleet.webhooks.delivery import deliver_message
from gpufleet.webhooks.urlpolicy import allow_private_from_env


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any]:
    return client("dynamodb"), client("sqs")


def queue_url_from_arn(arn: str, sqs) -> str:
    name = arn.rsplit(":", 1)[-1]
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    ddb, sqs = _clients()
    tables = TableNames.from_env()
    queue_url = os.environ.get("GPUFLEET_WEBHOOK_QUEUE_URL", "")
    allow_private = allow_private_from_env()
    failures = []
    for record in event.get("Records", []):
        url = queue_url or queue_url_from_arn(record["eventSourceARN"], sqs)
        result = deliver_message(
            record["body"],
            int(record.get("attributes", {}).get("ApproximateReceiveCount", "1")),
            ddb=ddb,
            jobs_table=tables.jobs,
            control_table=tables.control,
            sqs=sqs,
            queue_url=url,
            receipt_handle=record.get("receiptHandle"),
            allow_private=allow_private,
        )
        if not result.delivered and not result.refused:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
