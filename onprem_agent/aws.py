"""The agent's AWS adapters (the only boto3 code of the agent).

Each adapter takes an explicit client (tests inject moto-backed ones) and turns
``ClientError`` into outcomes the agent acts on:
- :class:`NodeQueue` — long-poll, visibility extension, release (visibility 0), delete.
- :class:`TaskTokens` — SendTaskHeartbeat/Success/Failure; a token the workflow
  no longer waits on (TaskTimedOut, InvalidToken, TaskDoesNotExist) is
  :class:`TaskGone`, so the agent stops the job instead of crashing.
- :class:`JobReader` — the job item fields a worker obeys (epoch, cancel_requested, generated).
- :class:`NodeRegistry` — the NODE# item of docs/contracts.md.
- :func:`probe_queue`, :func:`probe_table` — reachability for ``--check``: a :class:`Probe`
  (ok, detail), never an exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.errors import GpufleetError, TransientError
from gpufleet.store.clients import client as aws_client
from gpufleet.store.dynamo import error_code, marshal, unmarshal
from gpufleet.tables import JOB_META, NODE_SK, job_pk, node_pk

log = logging.getLogger("onprem_agent.aws")

_GONE = {"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"}


class TaskGone(GpufleetError):
    """The workflow no longer waits on this task token (it timed out, or was completed)."""

    status, type_slug, title = 410, "task-gone", "Task token is no longer valid"


def make_client(service: str, region: str, endpoint_url: str | None, read_timeout: int = 30):
    """The agent's clients: the one factory (:func:`gpufleet.store.clients.client`), 4 attempts."""
    return aws_client(service, region=region, endpoint_url=endpoint_url, max_attempts=4, read_timeout=read_timeout)


@dataclass(frozen=True)
class Probe:
    """Whether a resource answered with these credentials; ``detail`` names it or says why not."""

    ok: bool
    detail: str


def probe_queue(client, queue_url: str) -> Probe:
    try:
        client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    except (ClientError, BotoCoreError) as err:
        return Probe(False, str(err))
    return Probe(True, queue_url)


def probe_table(client, table: str) -> Probe:
    try:
        client.describe_table(TableName=table)
    except (ClientError, BotoCoreError) as err:
        return Probe(False, str(err))
    return Probe(True, table)


@dataclass(frozen=True)
class Message:
    message_id: str
    receipt: str
    body: str
    sent_at: float  # epoch seconds (SQS SentTimestamp)
    receive_count: int


class NodeQueue:
    def __init__(self, client, queue_url: str) -> None:
        self.client = client
        self.url = queue_url

    def receive(self, max_messages: int, wait_s: int, visibility_s: int) -> list[Message]:
        if max_messages <= 0:
            return []
        try:
            resp = self.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=min(10, max_messages),
                WaitTimeSeconds=wait_s,
                VisibilityTimeout=visibility_s,
                MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
            )
        except (ClientError, BotoCoreError) as err:
            raise TransientError(f"receive from {self.url} failed: {err}") from err
        out = []
        for m in resp.get("Messages", []):
            attrs = m.get("Attributes", {})
            out.append(
                Message(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    body=m["Body"],
                    sent_at=int(attrs.get("SentTimestamp", "0")) / 1000.0,
                    receive_count=int(attrs.get("ApproximateReceiveCount", "1")),
                )
            )
        return out

    def extend(self, receipt: str, seconds: int) -> bool:
        """Set the message's visibility timeout; False if the receipt is no longer valid."""
        try:
            self.client.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=seconds)
        except ClientError as err:
            log.warning("visibility change failed", extra={"code": error_code(err)})
            return False
        return True

    def release(self, receipt: str) -> bool:
        """Make an unstarted message visible again at once."""
        return self.extend(receipt, 0)

    def delete(self, receipt: str) -> None:
        try:
            self.client.delete_message(QueueUrl=self.url, ReceiptHandle=receipt)
        except ClientError as err:
            log.warning("delete failed; the message will be redelivered and deduplicated", extra={"code": error_code(err)})

    def attributes(self) -> dict[str, str]:
        return self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["All"])["Attributes"]


class TaskTokens:
    def __init__(self, client) -> None:
        self.client = client

    def _call(self, fn, **kwargs: Any) -> None:
        try:
            fn(**kwargs)
        except ClientError as err:
            if error_code(err) in _GONE:
                raise TaskGone(error_code(err)) from err
            raise TransientError(f"{error_code(err)}: {err}") from err
        except BotoCoreError as err:
            raise TransientError(str(err)) from err

    def heartbeat(self, token: str) -> None:
        self._call(self.client.send_task_heartbeat, taskToken=token)

    def succeed(self, token: str, output: str) -> None:
        self._call(self.client.send_task_success, taskToken=token, output=output)

    def fail(self, token: str, error: str, cause: str) -> None:
        self._call(self.client.send_task_failure, taskToken=token, error=error, cause=cause[:32768])


@dataclass(frozen=True)
class JobView:
    exists: bool
    current_epoch: int = 0
    cancel_requested: bool = False
    status: str = ""
    generated: dict[str, Any] | None = None


class JobReader:
    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def read(self, job_id: str) -> JobView:
        try:
            resp = self.client.get_item(
                TableName=self.table,
                Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
                ConsistentRead=True,
                ProjectionExpression="current_epoch, cancel_requested, #st, generated",
                ExpressionAttributeNames={"#st": "status"},
            )
        except (ClientError, BotoCoreError) as err:
            raise TransientError(f"reading job {job_id} failed: {err}") from err
        item = unmarshal(resp.get("Item"))
        if item is None:
            return JobView(exists=False)
        return JobView(
            exists=True,
            current_epoch=int(item.get("current_epoch", 0)),
            cancel_requested=bool(item.get("cancel_requested", False)),
            status=str(item.get("status", "")),
            generated=item.get("generated"),
        )


class NodeRegistry:
    def __init__(self, client, table: str) -> None:
        self.client = client
        self.table = table

    def put(self, item: dict[str, Any]) -> None:
        full = {"pk": node_pk(item["node_id"]), "sk": NODE_SK, **item}
        try:
            self.client.put_item(TableName=self.table, Item=marshal(full))
        except (ClientError, BotoCoreError) as err:
            raise TransientError(f"node heartbeat failed: {err}") from err

    def get(self, node_id: str) -> dict[str, Any] | None:
        resp = self.client.get_item(
            TableName=self.table, Key={"pk": {"S": node_pk(node_id)}, "sk": {"S": NODE_SK}}, ConsistentRead=True
        )
        return unmarshal(resp.get("Item"))
