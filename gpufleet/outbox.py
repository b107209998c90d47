"""Transactional outbox: the jobs table's stream starts each new job's workflow exactly once.

Contract:
- :func:`jobs_to_start` (pure) picks, from DynamoDB stream records, the jobs
  that were just inserted (``INSERT`` of a ``JOB#<id>`` / ``META`` item).
- :func:`start_workflow` starts the state machine with execution name = job id
  and input ``{"job_id": ...}``. A start for a job that already has an
  execution (a redelivered stream record, a retried batch) is a no-op that
  reports ``already_started``; the execution ARN is recorded on the job once.
  The AWS calls are :mod:`gpufleet.store.workflow`.
- :func:`process` handles one stream batch and returns the Lambda
  partial-batch response: records that failed are reported by sequence number
  so only they are retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import GpufleetError
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.workflow import record_execution_arn, start_execution
from gpufleet.tables import JOB_META, JOB_PREFIX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    job_id: str
    execution_arn: str
    outcome: str  # "started" | "already_started"


def jobs_to_start(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sequence number, job id) for every record that inserted a job item."""
    out = []
    for rec in records:
        if rec.get("eventName") != "INSERT":
            continue
        ddb = rec.get("dynamodb") or {}
        image = unmarshal(ddb.get("NewImage")) or {}
        if image.get("sk") == JOB_META and str(image.get("pk", "")).startswith(JOB_PREFIX) and image.get("job_id"):
            out.append((str(ddb.get("SequenceNumber", "")), image["job_id"]))
    return out


def start_workflow(sfn, state_machine_arn: str, job_id: str, *, ddb=None, jobs_table: str | None = None) -> Started:
    """Start the job's execution (name = job id); a duplicate start is a no-op."""
    arn, started = start_execution(sfn, state_machine_arn, job_id)
    if ddb is not None and jobs_table:
        record_execution_arn(ddb, jobs_table, job_id, arn)
    return Started(job_id, arn, "started" if started else "already_started")


def process(
    records: list[dict[str, Any]], sfn, state_machine_arn: str, *, ddb=None, jobs_table: str | None = None
) -> tuple[list[Started], dict[str, list[dict[str, str]]]]:
    """Start workflows for a stream batch; return what happened and the partial-batch response."""
    done: list[Started] = []
    failures: list[dict[str, str]] = []
    for seq, job_id in jobs_to_start(records):
        try:
            done.append(start_workflow(sfn, state_machine_arn, job_id, ddb=ddb, jobs_table=jobs_table))
        except GpufleetError as err:
            log.error("could not start the workflow of %s: %s", job_id, err)
            failures.append({"itemIdentifier": seq})
    return done, {"batchItemFailures": failures}

