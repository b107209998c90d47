"""DynamoDB stream consumer (jobs table): start each new job's workflow. Thin over :mod:`gpufleet.outbox`.

Settings (validated on the first invocation): ``GPUFLEET_STATE_MACHINE_ARN`` (required) and
``GPUFLEET_JOBS_TABLE``. Returns the partial-batch response (ReportBatchItemFailures).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import Field

from gpufleet import outbox
from gpufleet.settings import StorageSettings
from gpufleet.store.clients import client


class OutboxSettings(StorageSettings):
    state_machine_arn: str = Field(..., min_length=20)


@lru_cache(maxsize=1)
def _deps() -> tuple[OutboxSettings, Any, Any]:
    return OutboxSettings.load(), client("stepfunctions"), client("dynamodb")


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    settings, sfn, ddb = _deps()
    _, response = outbox.process(
        event.get("Records", []), sfn, settings.state_machine_arn, ddb=ddb, jobs_table=settings.jobs_table
    )
    return response
