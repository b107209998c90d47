"""Step Functions task `RunOnPrem` (``lambda:invoke.waitForTaskToken``): :func:`gpufleet.nodeapi.dispatch.dispatch`.

Stores the Run state's task token on the attempt item and sends the node its envelope without it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.clock import SystemClock
from gpufleet.nodeapi.dispatch import dispatch
from gpufleet.settings import StorageSettings
from gpufleet.store.clients import client
from gpufleet.store.queues import SqsMessageQueue
from gpufleet.store.runs import DynamoRunStore


@lru_cache(maxsize=1)
def _deps():
    clock = SystemClock()
    return DynamoRunStore(client("dynamodb"), StorageSettings.load().jobs_table, clock), client("sqs"), clock


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    runs, sqs, clock = _deps()
    return dispatch(runs, lambda url, body: SqsMessageQueue(sqs, url).send(body), clock, event)
