"""SQS adapter: create (idempotently) the per-node queue and its dead-letter queue.

Contract:
- :func:`ensure_node_queue` creates ``<prefix><node_id>-dlq`` and
  ``<prefix><node_id>`` (SSE with SQS-managed keys, redrive to the DLQ after
  ``max_receives`` receives, tagged ``gpufleet:node=<node_id>``) and returns
  both URLs. Calling it again for the same node returns the same queues.
- Node ids are validated (:data:`NODE_ID_PATTERN`) so the queue name stays
  within SQS limits and inside the IAM prefix the agents' role is scoped to.
- ``ClientError`` never escapes: it becomes :class:`gpufleet.errors.TransientError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from botocore.exceptions import ClientError

from gpufleet.errors import TransientError, ValidationFailed

NODE_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
NODE_TAG = "gpufleet:node"
RETENTION_S = 4 * 24 * 3600
DLQ_RETENTION_S = 14 * 24 * 3600


@dataclass(frozen=True)
class NodeQueue:
    node_id: str
    queue_url: str
    dlq_url: str


def queue_name(prefix: str, node_id: str) -> str:
    if not NODE_ID_PATTERN.match(node_id):
        raise ValidationFailed(f"node_id must match {NODE_ID_PATTERN.pattern}", field="node_id")
    return f"{prefix}{node_id}"


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
    except ClientError as exc:
        raise TransientError(f"could not create the queues of node {node_id}: {exc.response['Error']['Code']}")
    return NodeQueue(node_id=node_id, queue_url=url, dlq_url=dlq_url)
