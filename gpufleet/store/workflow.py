"""Adapters for the workflow services the lifecycle talks to: Step Functions task tokens, AWS Batch
jobs and the EventBridge bus (the only boto3 calls of cancellation and of the AwaitPlacement step).

Each adapter takes an explicit client and turns AWS errors into outcomes or :mod:`gpufleet.errors`:
- :class:`SfnTaskTokens` — ``fail`` sends ``SendTaskFailure`` (and, for the node API's Run tokens,
  ``heartbeat`` / ``succeed`` send ``SendTaskHeartbeat`` / ``SendTaskSuccess``); a token the workflow no
  longer waits on (TaskDoesNotExist, TaskTimedOut, InvalidToken) is an outcome (``False``), not an error.
- :class:`BatchJobs` — ``terminate_named`` terminates the unfinished jobs of a queue with one name.
- :class:`EventBridgeBus` — ``put`` sends one event; a failed call or a rejected entry is
  :class:`~gpufleet.errors.TransientError`.
- :func:`start_execution` starts a job's execution (name = job id, input ``{"job_id": ...}``, the
  job's trace as ``traceHeader``); when
  the job already has one (``ExecutionAlreadyExists``) it returns that execution's ARN and ``False``.
  :func:`record_execution_arn` sets ``execution_arn`` on an existing job item once
  (``attribute_not_exists``; a second record is a no-op). Both serve the outbox (:mod:`gpufleet.outbox`).
Throttling and connection errors are :class:`~gpufleet.errors.TransientError`; any other AWS error
is a :class:`~gpufleet.errors.DependencyFailed` naming the call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.errors import DependencyFailed, TransientError
from gpufleet.store.dynamo import conditional_write, error_code, marshal
from gpufleet.tables import JOB_META, job_pk

_GONE_TOKEN = {"TaskDoesNotExist", "TaskTimedOut", "InvalidToken"}
_THROTTLED = {"ThrottlingException", "TooManyRequestsException", "ServiceUnavailable", "InternalServerError",
              "ServerException"}
_FINISHED_BATCH = ("SUCCEEDED", "FAILED")


@contextmanager
def _aws(call: str) -> Iterator[None]:
    try:
        yield
    except ClientError as err:
        code = error_code(err)
        if code in _THROTTLED:
            raise TransientError(f"{call}: {code}") from err
        raise DependencyFailed(f"{call} failed: {code}: {err}") from err
    except BotoCoreError as err:
        raise TransientError(f"{call}: {err}") from err


class TaskTokens(Protocol):
    def fail(self, token: str, error: str, cause: dict[str, Any]) -> bool:
        """Fail the task waiting on ``token``; ``False`` when no task waits on it any more."""
        ...


class RunTokens(TaskTokens, Protocol):
    """Everything the node API does with a Run state's token (``False``: no task waits on it)."""

    def heartbeat(self, token: str) -> bool: ...

    def succeed(self, token: str, output: dict[str, Any]) -> bool: ...


class SfnTaskTokens:
    def __init__(self, client) -> None:
        self.client = client

    def _send(self, call: str, fn, **kwargs: Any) -> bool:
        with _aws(call):
            try:
                fn(**kwargs)
            except ClientError as err:
                if error_code(err) in _GONE_TOKEN:
                    return False
                raise
        return True

    def fail(self, token: str, error: str, cause: dict[str, Any]) -> bool:
        return self._send("SendTaskFailure", self.client.send_task_failure, taskToken=token, error=error,
                          cause=json.dumps(cause)[:32768])

    def heartbeat(self, token: str) -> bool:
        return self._send("SendTaskHeartbeat", self.client.send_task_heartbeat, taskToken=token)

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        return self._send("SendTaskSuccess", self.client.send_task_success, taskToken=token,
                          output=json.dumps(output, sort_keys=True))


class BatchJobs(Protocol):
    def terminate_named(self, queue: str, name: str, reason: str) -> list[str]:
        """Terminate the unfinished jobs named ``name`` in ``queue``; the ids terminated."""
        ...


class AwsBatchJobs:
    def __init__(self, client) -> None:
        self.client = client

    def terminate_named(self, queue: str, name: str, reason: str) -> list[str]:
        with _aws("ListJobs"):
            listed = self.client.list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [name]}])
        done = []
        for summary in listed.get("jobSummaryList", []):
            if summary.get("status") in _FINISHED_BATCH:
                continue
            with _aws("TerminateJob"):
                self.client.terminate_job(jobId=summary["jobId"], reason=reason)
            done.append(summary["jobId"])
        return done


class EventBus(Protocol):
    def put(self, detail_type: str, detail: dict[str, Any]) -> None:
        """Send one event; :class:`TransientError` when it was not accepted."""
        ...


class EventBridgeBus:
    def __init__(self, client, bus_name: str, source: str = "gpufleet") -> None:
        self.client = client
        self.bus_name = bus_name
        self.source = source

    def put(self, detail_type: str, detail: dict[str, Any]) -> None:
        entry = {"Source": self.source, "DetailType": detail_type, "Detail": json.dumps(detail),
                 "EventBusName": self.bus_name}
        try:
            resp = self.client.put_events(Entries=[entry])
        except (ClientError, BotoCoreError) as err:
            raise TransientError(f"not sent: {err}") from err
        if int(resp.get("FailedEntryCount", 0)):
            raise TransientError(f"rejected: {resp.get('Entries')}")


def execution_arn_for(state_machine_arn: str, job_id: str) -> str:
    """The ARN Step Functions gives the execution named ``job_id`` of ``state_machine_arn``."""
    prefix, _, name = state_machine_arn.rpartition(":stateMachine:")
    return f"{prefix}:execution:{name}:{job_id}"


def start_execution(sfn, state_machine_arn: str, job_id: str, *, name: str | None = None,
                    payload: dict[str, Any] | None = None, trace_header: str | None = None) -> tuple[str, bool]:
    """Start the job's execution (``name`` defaults to the job id, ``payload`` to ``{"job_id": ...}``);
    ``trace_header`` (an X-Ray ``Root=…;Parent=…;Sampled=…``) puts the execution in the job's trace.
    (ARN, whether this call started it)."""
    name = name or job_id
    extra = {"traceHeader": trace_header} if trace_header else {}
    with _aws("StartExecution"):
        try:
            resp = sfn.start_execution(stateMachineArn=state_machine_arn, name=name,
                                       input=json.dumps(payload or {"job_id": job_id}), **extra)
        except ClientError as err:
            if error_code(err) != "ExecutionAlreadyExists":
                raise
            return execution_arn_for(state_machine_arn, name), False
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
