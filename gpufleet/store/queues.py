"""SQS adapters: the per-node queues (created idempotently) and plain message queues (webhooks).

Contract:
- :func:`ensure_node_queue` creates ``<prefix><node_id>-dlq``,
  ``<prefix><node_id>`` (SSE with SQS-managed keys, redrive to the DLQ after
  ``max_receives`` receives, tagged ``gpufleet:node=<node_id>``) and the node's
  signal queue ``<prefix><node_id>_signals`` (:func:`signals_url`: the API's
  cancel nudges the agent there, so a cancel does not wait for the agent's next
  heartbeat) and returns their URLs. Calling it again for the same node returns
  the same queues (and creates the signal queue of a node onboarded before it existed).
- A node id never holds ``_`` (:data:`NODE_ID_PATTERN`), so no node's own queue
  name is another node's signal queue, and ``<prefix>*_signals`` names signal
  queues only (the API may send there, and nowhere else among the node queues).
- Node ids are validated (:data:`NODE_ID_PATTERN`) so the queue name stays
  within SQS limits and inside the IAM prefix the agents' role is scoped to.
- :class:`SqsNodeSignals` sends a node's signal queue a nudge (``{"type": "cancel", "job_id", "epoch"}``); the
  message carries no authority: the agent only heartbeats that attempt at once, and the node API's answer decides.
  A queue that does not exist (a node onboarded before signal queues) or refuses is an outcome (False), not an error:
  the agent's own heartbeat still sees the cancel.
- :class:`MessageQueue` sends a message body and hands a received message back for a later
  try (its visibility set to the delay).
- ``ClientError`` never escapes: it becomes :class:`gpufleet.errors.TransientError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.errors import TransientError, ValidationFailed

NODE_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
NODE_TAG = "gpufleet:node"
RETENTION_S = 4 * 24 * 3600
DLQ_RETENTION_S = 14 * 24 * 3600
SIGNALS_SUFFIX = "_signals"
SIGNALS_RETENTION_S = 600  # a nudge older than this is moot: the agent's own heartbeat has seen the cancel


@dataclass(frozen=True)
class NodeQueue:
    node_id: str
    queue_url: str
    dlq_url: str
    signals_url: str = ""


def signals_url(queue_url: str) -> str:
    """The signal queue's URL beside a node queue's (the same account, region and prefix)."""
    return queue_url + SIGNALS_SUFFIX


def queue_name(prefix: str, node_id: str) -> str:
    if not NODE_ID_PATTERN.match(node_id):
        raise ValidationFailed(f"node_id must match {NODE_ID_PATTERN.pattern}", field="node_id")
    return f"{prefix}{node_id}"


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def ensure_node_queue(
    sqs, node_id: str, *, prefix: str, max_receives: int, visibility_timeout_s: int = 60
) -> NodeQueue:
    name = queue_name(prefix, node_id)
    tags = {NODE_TAG: node_id}
    try:
        dlq_url = sqs.create_queue(
            QueueName=f"{name}-dlq",
            Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": str(DLQ_RETENTION_S)},
            tags=tags,
        )["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        url = sqs.create_queue(
            QueueName=name,
            Attributes={
                "SqsManagedSseEnabled": "true",
                "MessageRetentionPeriod": str(RETENTION_S),
                "VisibilityTimeout": str(visibility_timeout_s),
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receives)}),
            },
            tags=tags,
        )["QueueUrl"]
        signals = sqs.create_queue(
            QueueName=name + SIGNALS_SUFFIX,
            Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": str(SIGNALS_RETENTION_S)},
            tags=tags,
        )["QueueUrl"]
    except ClientError as exc:
        raise TransientError(f"could not create the queues of node {node_id}: {_code(exc)}") from exc
    return NodeQueue(node_id=node_id, queue_url=url, dlq_url=dlq_url, signals_url=signals)


class NodeSignals(Protocol):
    def nudge(self, queue_url: str, job_id: str, epoch: int) -> bool: ...


class SqsNodeSignals:
    """:class:`NodeSignals` over SQS: the signal queue beside the node queue ``queue_url``."""

    def __init__(self, sqs) -> None:
        self.sqs = sqs

    def nudge(self, queue_url: str, job_id: str, epoch: int) -> bool:
        body = json.dumps({"type": "cancel", "job_id": job_id, "epoch": epoch}, sort_keys=True)
        try:
            self.sqs.send_message(QueueUrl=signals_url(queue_url), MessageBody=body)
        except (ClientError, BotoCoreError):  # the cancel is recorded; a lost nudge only waits for the heartbeat
            return False
        return True


class MessageQueue(Protocol):
    def send(self, body: str) -> str: ...

    def retry_later(self, receipt_handle: str, delay_s: int) -> None: ...


class SqsMessageQueue:
    """:class:`MessageQueue` over one SQS queue."""

    def __init__(self, sqs, queue_url: str) -> None:
        self.sqs = sqs
        self.queue_url = queue_url

    def send(self, body: str) -> str:
        """Send ``body``; returns the SQS message id."""
        try:
            return self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=body).get("MessageId", "")
        except ClientError as exc:
            raise TransientError(f"could not send to {self.queue_url}: {_code(exc)}") from exc

    def retry_later(self, receipt_handle: str, delay_s: int) -> None:
        """Make the received message visible again after ``delay_s`` seconds (SQS redelivers it then)."""
        try:
            self.sqs.change_message_visibility(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle,
                                               VisibilityTimeout=delay_s)
        except ClientError as exc:
            raise TransientError(f"could not delay a message of {self.queue_url}: {_code(exc)}") from exc
