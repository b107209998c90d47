"""Transactional outbox: the jobs table's stream starts each new job's workflow exactly once.

Contract:
- :func:`jobs_to_start` (pure) picks, from DynamoDB stream records, the jobs
  that were just inserted (``INSERT`` of a ``JOB#<id>`` / ``META`` item).
- :func:`start_workflow` starts the state machine with execution name = job id
  and input ``{"job_id": ...}``. A start for a job that already has an
  execution (``ExecutionAlreadyExists``: a redelivered stream record, a retried
  batch) is a no-op that reports ``already_started``; the execution ARN is
  recorded on the job once (``attribute_not_exists``).
- :func:`process` handles one stream batch and returns the Lambda
  partial-batch response: records that failed are reported by sequence number
  so only they are retried.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.store.dynamo import error_code, unmarshal
from gpufleet.tables import JOB_META, job_pk

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
        if image.get("sk") == JOB_META and str(image.get("pk", "")).startswith("JOB#") and image.get("job_id"):
            out.append((str(ddb.get("SequenceNumber", "")), image["job_id"]))
    return out


def execution_arn_for(state_machine_arn: str, job_id: str) -> str:
    """The ARN Step Functions gives the execution named ``job_id`` of ``state_machine_arn``."""
    prefix, _, name = state_machine_arn.rpartition(":stateMachine:")
    return f"{prefix}:execution:{name}:{job_id}"


def start_workflow(sfn, state_machine_arn: str, job_id: str, *, ddb=None, jobs_table: str | None = None) -> Started:
    """Start the job's execution (name = job id); a duplicate start is a no-op."""
    try:
        resp = sfn.start_execution(stateMachineArn=state_machine_arn, name=job_id, input=json.dumps({"job_id": job_id}))
        started = Started(job_id, resp["executionArn"], "started")
    except ClientError as err:
        if error_code(err) != "ExecutionAlreadyExists":
            raise
        started = Started(job_id, execution_arn_for(state_machine_arn, job_id), "already_started")
    if ddb is not None and jobs_table:
        try:
            ddb.update_item(
                TableName=jobs_table,
                Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
                UpdateExpression="SET execution_arn = :a",
                ConditionExpression="attribute_exists(pk) AND attribute_not_exists(execution_arn)",
                ExpressionAttributeValues={":a": {"S": started.execution_arn}},
            )
        except ClientError as err:
            if error_code(err) != "ConditionalCheckFailedException":
                raise
    return started


def process(
    records: list[dict[str, Any]], sfn, state_machine_arn: str, *, ddb=None, jobs_table: str | None = None
) -> tuple[list[Started], dict[str, list[dict[str, str]]]]:
    """Start workflows for a stream batch; return what happened and the partial-batch response."""
    done: list[Started] = []
    failures: list[dict[str, str]] = []
    for seq, job_id in jobs_to_start(records):
        try:
            done.append(start_workflow(sfn, state_machine_arn, job_id, ddb=ddb, jobs_table=jobs_table))
        except ClientError as err:
            log.error("could not start the workflow of %s: %s", job_id, err)
            failures.append({"itemIdentifier": seq})
    return done, {"batchItemFailures": failures}
