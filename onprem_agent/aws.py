"""The agent's AWS adapters (the only boto3 code of the agent).

Each adapter takes an explicit client (tests inject moto-backed ones) and turns
``ClientError`` into outcomes the agent acts on:
- :class:`NodeQueue` — long-poll, visibility extension, release (visibility 0), delete.
- :class:`SignalQueue` — the node's signal queue: long-poll and delete cancel nudges (``(job_id, epoch)``); a
  queue that does not exist or refuses is ``None`` (the agent stops listening: its heartbeats still see cancels).
- :class:`AttemptReports` — the task heartbeat (which answers the job's view: epoch,
  cancel_requested) and the outcome, as node API calls the server checks (the node holds no task
  token and cannot read job items); a task the workflow no longer waits on is :class:`TaskGone`,
  so the agent stops the job instead of crashing.
- :class:`NodeRegistry` — the node's liveness report (the server builds the NODE# item of
  docs/contracts.md from the operator's registration).
- :func:`probe_queue`, :func:`probe_node_api`, :func:`probe_table` — reachability for ``--check``: a
  :class:`Probe` (ok, detail), never an exception.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.errors import GpufleetError, NotAllowed, TaskGone, TransientError, ValidationFailed
from gpufleet.store.clients import client as aws_client
from gpufleet.store.dynamo import error_code
from gpufleet.store.nodeapi import NodeApiClient

__all__ = ["AttemptReports", "JobView", "Message", "NodeApiClient", "NodeQueue", "NodeRegistry", "Probe", "SignalQueue",
           "TaskGone", "make_client", "probe_node_api", "probe_queue", "probe_table"]

log = logging.getLogger("onprem_agent.aws")

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


class SignalQueue:
    """Cancel nudges for this node's attempts (:class:`gpufleet.store.queues.SqsNodeSignals` sends them). A nudge
    carries no authority: the agent heartbeats the attempt it names, and the node API's answer decides."""

    UNAVAILABLE = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "AccessDenied",
                   "AccessDeniedException")

    def __init__(self, client, queue_url: str) -> None:
        self.client = client
        self.url = queue_url

    def receive(self, wait_s: int) -> list[tuple[str, int]] | None:
        """The nudges received within ``wait_s`` (deleted once read: a nudge is worth one heartbeat); None if the
        queue does not exist or this node may not read it. Malformed bodies are dropped."""
        try:
            resp = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s)
        except ClientError as err:
            if error_code(err) in self.UNAVAILABLE:
                return None
            raise TransientError(f"receive from {self.url} failed: {error_code(err)}") from err
        except BotoCoreError as err:
            raise TransientError(f"receive from {self.url} failed: {err}") from err
        out = []
        for m in resp.get("Messages", []):
            try:
                self.client.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
            except (ClientError, BotoCoreError) as err:
                log.warning("signal delete failed", extra={"detail": str(err)})
            try:
                doc = json.loads(m["Body"])
                if doc.get("type") == "cancel":
                    out.append((str(doc["job_id"]), int(doc["epoch"])))
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
                log.warning("malformed signal dropped", extra={"message_id": m.get("MessageId")})
        return out


class AttemptReports:
    """The agent's calls about its attempts, through the node API (the server checks assignment and epoch,
    and answers the workflow with the task token it keeps; the agent never holds one).

    ``heartbeat`` keeps the Run task alive and returns the job's view; a refused call raises what the
    server said: :class:`TaskGone` (the workflow no longer waits), :class:`gpufleet.errors.StaleEpoch`
    (a newer attempt owns the job), :class:`gpufleet.errors.NotAllowed` (not this node's attempt);
    anything transient is :class:`TransientError`."""

    def __init__(self, api: NodeApiClient) -> None:
        self.api = api

    def heartbeat(self, job_id: str, epoch: int) -> JobView:
        item = self.api.attempt(job_id, epoch, "heartbeat")
        return JobView(exists=True, current_epoch=int(item.get("current_epoch", 0)),
                       cancel_requested=bool(item.get("cancel_requested", False)), status=str(item.get("status", "")),
                       generated=item.get("generated"),
                       gang_released=bool(item["gang"].get("released")) if isinstance(item.get("gang"), dict) else None)

    def succeed(self, job_id: str, epoch: int, gpu_seconds: float) -> None:
        self.api.attempt(job_id, epoch, "complete", {"gpu_seconds": max(0.0, float(gpu_seconds))})

    def fail(self, job_id: str, epoch: int, error: str, detail: str) -> None:
        self.api.attempt(job_id, epoch, "fail", {"error": error, "detail": detail[:8000]})


@dataclass(frozen=True)
class JobView:
    exists: bool
    current_epoch: int = 0
    cancel_requested: bool = False
    status: str = ""
    generated: dict[str, Any] | None = None
    #: a gang member's barrier: ``released`` once every member is ready (None: not a gang)
    gang_released: bool | None = None


class NodeRefused(TransientError):
    """The node API refused the node's own heartbeat (403: not registered, e.g. deregistered by an operator). Kept a
    TransientError: the agent keeps heartbeating, and an operator's registration makes the next one land."""


class NodeRegistry:
    """The node's liveness heartbeat, through the node API: the server writes the node item from the
    operator's registration with this report clamped into it (pool, site and inventory are not the
    node's to say). An unregistered node is refused (:class:`gpufleet.errors.NotAllowed`)."""

    def __init__(self, api: NodeApiClient) -> None:
        self.api = api

    @staticmethod
    def report(item: dict[str, Any]) -> dict[str, Any]:
        """The liveness report of a node item built by :func:`onprem_agent.node.node_item`."""
        resident = list(item.get("resident_models", []))
        topology = str(item.get("gpu_topology") or "")
        return {
            **({"topology": topology} if topology else {}),  # likewise: only when NVML told it
            # only when there is something resident: an agent with warm workers off stays compatible with a
            # node API older than the field (its report refuses unknown fields)
            **({"resident_models": resident} if resident else {}),
            "free_milli": {str(g["index"]): int(g["milli_free"]) for g in item.get("gpus", [])},
            "cpu_milli_free": int(item.get("cpu_milli_free", 0)),
            "memory_mib_free": int(item.get("memory_mib_free", 0)),
            "cached_models": list(item.get("cached_models", [])),
            "datasets": list(item.get("datasets", [])),
            "accelerator": item.get("accelerator", "cpu"),
            "draining": bool(item.get("draining", False)),
            "running_jobs": int(item.get("running_jobs", 0)),
        }

    def put(self, item: dict[str, Any], ttl_s: int, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Report the node's liveness, with ``metrics`` (:class:`onprem_agent.metrics.ShippedMetrics`) when
        given. A node API older than the ``metrics`` field refuses it (400): the report is then sent without
        it, so liveness never depends on metrics."""
        report = {**self.report(item), "ttl_s": int(ttl_s)}
        try:
            if metrics is not None:
                try:
                    return self.api.call("POST", "/v1/node/heartbeat", {**report, "metrics": metrics})
                except ValidationFailed as err:
                    log.warning("node metrics refused; reporting liveness without them", extra={"detail": str(err)})
            return self.api.call("POST", "/v1/node/heartbeat", report)
        except NotAllowed as err:
            raise NodeRefused(f"node heartbeat refused: {err.detail}") from err

    def get(self) -> dict[str, Any]:
        return self.api.call("GET", "/v1/node/self")


def probe_node_api(api: NodeApiClient) -> Probe:
    try:
        reg = api.call("GET", "/v1/node/self")
    except GpufleetError as err:
        return Probe(False, err.detail)
    return Probe(True, f"registered in pool {reg.get('pool')} at {api.url}")
