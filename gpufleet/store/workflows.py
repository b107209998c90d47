"""Step Functions executions of jobs, and the execution ARN recorded on the job item.

Contract:
- :func:`start_execution` starts ``state_machine_arn`` with execution name = job id and input
  ``{"job_id": ...}``; returns (execution ARN, True), or (the ARN Step Functions gave that name,
  False) when the job already has an execution (``ExecutionAlreadyExists``). Other errors become
  :class:`gpufleet.errors.TransientError`.
- :func:`record_execution_arn` sets ``execution_arn`` on an existing job item once
  (``attribute_not_exists``); a second record is a no-op.
"""

from __future__ import annotations

import json

from botocore.exceptions import ClientError

from gpufleet.errors import TransientError
from gpufleet.store.dynamo import conditional_write, error_code, marshal
from gpufleet.tables import JOB_META, job_pk


def execution_arn_for(state_machine_arn: str, job_id: str) -> str:
    """The ARN Step Functions gives the execution named ``job_id`` of ``state_machine_arn``."""
    prefix, _, name = state_machine_arn.rpartition(":stateMachine:")
    return f"{prefix}:execution:{name}:{job_id}"


def start_execution(sfn, state_machine_arn: str, job_id: str) -> tuple[str, bool]:
    """Start the job's execution; (ARN, whether this call started it)."""
    try:
        resp = sfn.start_execution(stateMachineArn=state_machine_arn, name=job_id, input=json.dumps({"job_id": job_id}))
    except ClientError as err:
        if error_code(err) != "ExecutionAlreadyExists":
            raise TransientError(f"could not start the workflow of {job_id}: {error_code(err)}: {err}") from err
        return execution_arn_for(state_machine_arn, job_id), False
    return resp["executionArn"], True


def record_execution_arn(ddb, jobs_table: str, job_id: str, execution_arn: str) -> None:
    """Record ``execution_arn`` on the job item once (kept if one is there; nothing if no job)."""
    conditional_write(
        ddb.update_item,
        TableName=jobs_table,
        Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}),
        UpdateExpression="SET execution_arn = :a",
        ConditionExpression="attribute_exists(pk) AND attribute_not_exists(execution_arn)",
        ExpressionAttributeValues={":a": {"S": execution_arn}},
    )
