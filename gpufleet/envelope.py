"""The runtime contract shared by the on-prem agent and the cloud GPU container.

A worker is handed an :class:`Envelope` (JSON) and runs one stage of one
attempt; its ``spec`` is the job's :class:`gpufleet.spec.JobSpec` (serialized as the API stores it:
JSON, ``None`` fields left out), its ``placement`` the attempt's placement document
(:class:`gpufleet.placement.Placement`). An envelope whose spec does not validate does not parse.

Two forms: the workflow's state and the Batch container overrides carry a *pointer* envelope
(:meth:`Envelope.pointer`: ids, epoch, placement, platform buckets and tables; no ``spec``, no input
URIs), so prompts and container env never sit in execution history or in Batch job descriptions; the
worker reads the spec from the job item (the Batch runtime with its job role; for an on-prem node,
RunOnPrem's dispatch reads it and sends the node the whole envelope) and completes it with
:meth:`Envelope.with_spec`.
``traceparent`` (both forms) is the job's trace (:mod:`gpufleet.tracing`): the worker logs its trace id.
Every write it makes is fenced by ``epoch``. It exits with one of :class:`ExitCode`, which the
orchestrator classifies into retry and billing.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from gpufleet import gang
from gpufleet.errors import NotAllowed
from gpufleet.gang import GangRole
from gpufleet.placement import Placement
from gpufleet.spec import JobSpec
from gpufleet.status import FailureClass


class ExitCode(IntEnum):
    SUCCEEDED = 0
    USER_ERROR = 10
    SYSTEM_ERROR = 20
    PREEMPTED = 30
    CANCELLED = 40
    FENCED = 50  # a newer attempt owns the job; this worker stopped
    TIMED_OUT = 60  # the attempt ran past the spec's max_run_seconds: the runtime (or the agent) stopped it

    def failure_class(self) -> FailureClass | None:
        return {
            ExitCode.SUCCEEDED: None,
            ExitCode.USER_ERROR: FailureClass.USER,
            ExitCode.SYSTEM_ERROR: FailureClass.SYSTEM,
            ExitCode.PREEMPTED: FailureClass.PREEMPTED,
            ExitCode.CANCELLED: FailureClass.CANCELLED,
            ExitCode.FENCED: FailureClass.PREEMPTED,
            ExitCode.TIMED_OUT: FailureClass.TIMED_OUT,
        }[self]

    @classmethod
    def classify(cls, code: int) -> ExitCode:
        """Map any process exit code to the contract; unknown codes (crashes, signals) are system errors."""
        try:
            return cls(code)
        except ValueError:
            return cls.SYSTEM_ERROR


#: the signal an agent sends its runtime's process group to stop it, per reason (docs/runtime.md "Signals"):
#: SIGTERM is a drain or a preemption (checkpoint, exit PREEMPTED); a cancel and the spec's time limit have signals
#: of their own, so that the runtime stops as they ask (a tenant container gets the short cancel grace, a video job
#: no checkpoint) and exits with their code itself. A runtime without these handlers dies of them (default action):
#: the agent's report still names its own stop reason.
STOP_SIGNALS: dict[ExitCode, signal.Signals] = {
    ExitCode.PREEMPTED: signal.SIGTERM,
    ExitCode.CANCELLED: signal.SIGUSR1,
    ExitCode.TIMED_OUT: signal.SIGUSR2,
}


class S3Locations(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bucket_outputs: str
    bucket_checkpoints: str
    bucket_logs: str
    output_prefix: str  # e.g. jobs/<job_id>/
    checkpoint_prefix: str  # e.g. jobs/<job_id>/
    log_prefix: str  # e.g. jobs/<job_id>/attempt-<epoch>/
    inputs: list[str] = Field(default_factory=list)
    #: what a container job may leave under ``<output_prefix>output/`` (the platform's per-job cap,
    #: ``GPUFLEET_OUTPUT_MAX_BYTES`` / ``_FILES`` of the lifecycle); None: no cap (older envelopes)
    output_max_bytes: int | None = Field(None, ge=0)
    output_max_files: int | None = Field(None, ge=0)


class Envelope(BaseModel):
    """Everything a worker needs to run one stage of one attempt."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    attempt: int = Field(ge=1)
    epoch: int = Field(ge=1)
    stage: Literal["generate", "finalize", "container"]
    #: the job's spec; None in a pointer envelope (the worker reads it from the job item)
    spec: JobSpec | None = None
    s3: S3Locations
    placement: Placement | None = None
    tables: dict[str, str] = Field(default_factory=dict)
    task_token: str | None = None
    heartbeat_seconds: int = 30
    #: this member's rank, the world size and the rendezvous of a multi-node attempt (:mod:`gpufleet.gang`);
    #: None for a single-node attempt
    gang: GangRole | None = None
    #: the job's W3C traceparent (:mod:`gpufleet.tracing`; kept in the pointer form: it is no content);
    #: the runtime and the agent put its trace id on every log line of the attempt. None: an older job
    traceparent: str | None = Field(None, pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
    #: the content hash the job's model must have (pinned from the model catalog at submission,
    #: :mod:`gpufleet.store.model_catalog`; kept in the pointer form: it is no content); None: nothing pinned
    model_hash: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")

    @field_serializer("spec")
    def _stored_spec(self, spec: JobSpec | None) -> dict[str, Any] | None:
        """The spec as the job item stores it (JSON values, ``None`` fields left out)."""
        return None if spec is None else spec.model_dump(mode="json", exclude_none=True)

    def pointer(self) -> Envelope:
        """This envelope without the job's content: no spec, no input URIs, no task token."""
        return self.model_copy(update={"spec": None, "task_token": None,
                                       "s3": self.s3.model_copy(update={"inputs": []})})

    def with_spec(self, spec: JobSpec) -> Envelope:
        """The whole envelope of a pointer: ``spec`` (read from the job item) and its declared inputs."""
        return self.model_copy(update={"spec": spec, "s3": self.s3.model_copy(update={"inputs": list(spec.data.inputs)})})


def member_envelopes(env: Envelope, addresses: Mapping[str, str] | None = None,
                     barrier_timeout_s: int = gang.BARRIER_TIMEOUT_S) -> list[tuple[str, Envelope]]:
    """``(queue_url, envelope)`` per member of ``env``'s placement, in rank order (:mod:`gpufleet.gang`).

    ``addresses`` maps node ids to their registered ``address``; missing → the node id. Raises
    :class:`NotAllowed` when the placement is missing or a member has no node or queue."""
    p = env.placement
    if p is None or not p.queue_url:
        raise NotAllowed(f"attempt {env.epoch} of {env.job_id} has no on-prem placement")
    if not p.members or len(p.members) < 2:
        return [(p.queue_url, env)]
    members = p.members
    if any(not m.node or not m.queue_url for m in members):
        raise NotAllowed(f"attempt {env.epoch} of {env.job_id}: a gang member has no node or queue")
    nodes = [str(m.node) for m in members]
    if len(set(nodes)) != len(nodes):
        raise NotAllowed(f"attempt {env.epoch} of {env.job_id}: a node appears twice in the gang")
    addr = (addresses or {}).get(nodes[0]) or nodes[0]
    port = gang.master_port(env.job_id, env.epoch)
    out = []
    for rank, m in enumerate(members):
        placement = p.model_copy(update={"node": m.node, "queue_url": m.queue_url, "gpu_indices": list(m.gpu_indices)})
        role = GangRole(rank=rank, world_size=len(members), nodes=nodes, master_addr=addr, master_port=port,
                        barrier_timeout_s=barrier_timeout_s)
        out.append((str(m.queue_url), env.model_copy(update={"placement": placement, "gang": role})))
    return out
