"""Step Functions task `RunCloudContainer` (``lambda:invoke.waitForTaskToken``):
:func:`gpufleet.nodeapi.cloud_dispatch.dispatch_cloud`.

Registers the image's definition once, stores the Run state's task token and the supervisor token's hash on the
attempt, then submits the Batch job with the per-attempt override; neither token nor the tenant's env is in the
state. Settings: :class:`gpufleet.nodeapi.settings.CloudDispatchEnv`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.clock import SystemClock
from gpufleet.nodeapi.cloud_dispatch import dispatch_cloud
from gpufleet.nodeapi.settings import CloudDispatchEnv
from gpufleet.store.clients import client
from gpufleet.store.jobdefs import BatchJobDefinitions, batch_submitter
from gpufleet.store.runs import DynamoRunStore


@lru_cache(maxsize=1)
def _deps():
    settings = CloudDispatchEnv.load()
    clock = SystemClock()
    batch = client("batch")
    runs = DynamoRunStore(client("dynamodb"), settings.jobs_table, clock)
    return runs, BatchJobDefinitions(batch), batch_submitter(batch), clock, settings.dispatch()


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    runs, jobdefs, submit, clock, settings = _deps()
    return dispatch_cloud(runs, jobdefs, submit, clock, settings, event)
