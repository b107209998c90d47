"""Request and response models of the API (pydantic v2); the OpenAPI document is generated from them.

The request body of ``POST /v1/jobs`` is :class:`gpufleet.spec.JobSpec` itself.
Response models name every field the API promises; storage plumbing never leaks.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufleet.clock import iso
from gpufleet.spec import WebhookEvent
from gpufleet.status import JobStatus


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``); extra members name specifics."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="URI naming the problem type, https://gpufleet.dev/problems/<slug>")
    title: str
    status: int
    detail: str
    instance: str | None = None


class Progress(_Out):
    step: int = 0
    total: int = 0


class SchedulingView(_Out):
    """Why a PENDING job is not placed yet, as the scheduler's last pass recorded it."""

    reason: str = Field(description="e.g. none of the job's pools exists; no pool offers that GPU type")
    retry_at: str | None = Field(None, description="when the scheduler tries the job again (ISO 8601)")


class QueuePosition(_Out):
    """Where a PENDING job stood in the scheduler's last pass (gpufleet.scheduler.queueview)."""

    position: int = Field(description="1-based, among the jobs the pass left PENDING")
    pending: int = Field(description="jobs the pass left PENDING")
    estimated_start: str | None = Field(
        None, description="ISO 8601; from the last pass's placement rate; null when that pass placed nothing")
    as_of: str = Field(description="when that pass ran (ISO 8601)")


class GangMember(_Out):
    """One member of a gang attempt (``GET /v1/jobs/{id}``'s ``members``)."""

    node: str
    rank: int
    gpus: list[int] = Field(description="the GPU indices of the node booked for this member")
    state: str = Field(description="dispatched, ready (at the start barrier or running), succeeded; once the gang "
                                   "failed: failed (the member blamed) or stopped")


class JobView(_Out):
    """A job as the API shows it."""

    job_id: str
    status: JobStatus
    owner: str = Field(description="<tenant>/<team>/<user>")
    tenant: str
    team: str
    user: str
    spec: dict[str, Any] = Field(description="the submitted JobSpec with defaults filled in")
    priority: int = 100
    created_at: str
    updated_at: str
    cancel_requested: bool = False
    current_epoch: int = 0
    attempt_count: int = 0
    preemptions: int = 0
    system_failures: int = 0
    progress: Progress | None = None
    placement: dict[str, Any] | None = None
    members: list[GangMember] | None = Field(
        None, description="a gang (resources.nodes > 1) once placed: each member of the placement's attempt, rank order")
    billing: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    last_run: dict[str, Any] | None = Field(
        None, description='the last run that finished: {"epoch", "gpu_seconds", "phases": {"durations": '
                          '{phase: seconds} (checkpoint_stall among them: seconds the loop waited on checkpoints), '
                          '"model_cache", "model_bytes", "steps", "mean_step_s", "gpu_busy" (NVML-sampled busy share, '
                          'absent when not measured), "gpu_busy_samples"}} (docs/runtime.md)'
    )
    scheduling: SchedulingView | None = Field(
        None, description="only while PENDING: why the scheduler has not placed the job (after a backoff)"
    )
    retry_of: str | None = Field(None, description="the ended job this one retries (POST /v1/jobs/{id}/retry)")
    array_id: str | None = Field(None, description="the job array this job is an element of")
    array_index: int | None = Field(None, description="this element's index in its array (0-based)")
    model_hash: str | None = Field(
        None, description="a video.generate job's model content (the SHA-256 of its manifest), pinned from the "
        "deployment's model catalog at submission: the attempt runs that content or fails; none for a built-in model")
    queue: QueuePosition | None = Field(
        None, description="only while PENDING: the job's place in the scheduler's last pass and an estimated start"
    )
    recovery: dict[str, Any] | None = Field(
        None, description="the last operator recovery action: {action, by, at, reason, run} (release, refinalize, close)"
    )
    traceparent: str | None = Field(
        None, description="the job's W3C trace (the submitter's trace id, or one the API started): every log line "
                          "of the job carries its trace id; X-Ray trace 1-<first 8 hex>-<other 24 hex>"
    )

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> JobView:
        data = dict(item)
        data.setdefault(
            "owner", data.get("owner_path") or f"{data.get('tenant')}/{data.get('team')}/{data.get('user')}"
        )
        # the reason outlives the backoff on the item; it only means something while the job waits
        if data.get("status") == JobStatus.PENDING.value and data.get("sched_reason"):
            until = data.get("sched_backoff_until")
            data["scheduling"] = {"reason": data["sched_reason"], "retry_at": iso(float(until)) if until else None}
        return cls.model_validate(data)


class JobPage(_Out):
    jobs: list[JobView]
    next_cursor: str | None = Field(None, description="opaque; pass as `cursor` for the next page; null at the end")


class EventView(_Out):
    ts: str
    type: str
    detail: dict[str, Any] = Field(default_factory=dict)


class EventList(_Out):
    job_id: str
    events: list[EventView]


class LogLine(BaseModel):
    model_config = ConfigDict(extra="allow")

    ts: str | None = None
    level: str | None = None
    msg: str = ""
    epoch: int | None = None


class LogPage(_Out):
    job_id: str
    lines: list[LogLine]
    next: str | None = Field(None, description="position after the last chunk returned; pass as `after` to follow")


class OutputFile(_Out):
    path: str = Field(description="path under the job's output directory")
    bytes: int
    url: str = Field(description="presigned GET link, valid until `expires_at`")


class OutputView(_Out):
    """A SUCCEEDED job's output: the signed video (``kind`` video) or the files a container job wrote
    under its output directory (``kind`` files), as presigned links valid at most 15 minutes."""

    job_id: str
    kind: Literal["video", "files"] = "video"
    video_url: str | None = Field(None, description="video jobs: the watermarked, C2PA-signed MP4")
    manifest_url: str | None = None
    expires_at: str
    watermark_payload: str | None = None
    files: list[OutputFile] = Field(default_factory=list, description="container jobs: every file, in path order")
    total_bytes: int | None = Field(None, description="container jobs: the files' total size")


class ProvenanceLookupRequest(BaseModel):
    """A questioned video, reduced to what the watermark detector reads: its frames' mean luma."""

    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=16, le=4096)
    height: int = Field(..., ge=16, le=4096)
    luma_b64: str = Field(..., description="width×height uint8 mean luma (BT.601), row-major, base64; at most "
                          "2 228 224 px (1920×1088 scale larger videos down by half first)", max_length=2_971_000)


class ProvenanceMatch(_Out):
    """A delivered video whose watermark payload the questioned one carries, and its kept manifest."""

    job_id: str
    published_at: str | None = None
    watermark_key_id: str | None = None
    video_sha256: str | None = None
    manifest_url: str = Field(..., description="presigned link (at most 15 minutes) to the C2PA manifest store")
    video_url: str | None = Field(None, description="the signed original: only when the job is the caller's tenant's")
    own: bool = False


class ProvenanceLookup(_Out):
    """What the platform's watermark detector found, and the jobs whose payload it is."""

    found: bool
    watermark_payload: str | None = None
    watermark_key_id: str | None = None
    sync_z: float
    scale: float | None = None
    flipped: bool | None = None
    matches: list[ProvenanceMatch] = Field(default_factory=list)
    expires_at: str


class Delivery(BaseModel):
    """One try at delivering a webhook event, as the webhook sender logged it (oldest first)."""

    model_config = ConfigDict(extra="allow")

    msg_id: str | None = Field(None, description="the same for every try of one event")
    event_type: str | None = Field(None, description="job.started | job.progress | job.completed")
    url: str | None = None
    endpoint_id: str | None = Field(None, description="the tenant webhook endpoint this try went to; null: the job's "
                                    "own spec.webhook")
    attempt: int | None = Field(None, description="1 for the first try")
    status_code: int | None = Field(None, description="the receiver's HTTP status; 0 = no response")
    delivered: bool | None = Field(None, description="true on a 2xx response")
    at: str | None = Field(None, description="when this try was made (ISO 8601)")
    next_retry_at: str | None = Field(None, description="when the sender tries again; null once delivered or exhausted")
    dead_lettered: bool | None = Field(None, description="true on a final failure (sent to the dead-letter queue)")


class DeliveryList(_Out):
    job_id: str
    deliveries: list[Delivery]


class QuotaLevel(_Out):
    """One level of the quota tree; GPU amounts are in milli-GPUs per GPU type (``*``/``all`` = every type)."""

    path: str
    level: str = Field(description="tenant | team | user")
    configured: bool = Field(description="false when no quota node exists at this level (no limit)")
    limits: dict[str, float] = Field(default_factory=dict, description="guarantee + borrowing limit")
    usage: dict[str, float] = Field(default_factory=dict, description="in use now")
    guarantee: dict[str, float] = Field(default_factory=dict)
    borrow_limit: dict[str, float] = Field(default_factory=dict)
    weight: dict[str, float] = Field(default_factory=dict)


class QueuedLimits(_Out):
    user: int
    team: int
    user_limit: int
    team_limit: int


class QuotaView(_Out):
    tenant: str
    team: str
    user: str
    levels: list[QuotaLevel] = Field(description="tenant, then team, then user")
    queued: QueuedLimits = Field(description="soft submission limit: jobs QUEUED, PENDING or SCHEDULED")


class PoolCapacity(_Out):
    gpus_total: float
    gpus_free: float
    nodes: int | None = Field(None, description="live nodes (on-prem pools)")
    gpus_in_use: float | None = Field(None, description="GPUs in use (cloud pools)")


class PoolView(_Out):
    name: str
    kind: str = Field(description="onprem | spot | ondemand")
    region: str
    gpu_type: str
    max_gpus: int
    price_per_gpu_hour: float
    egress_per_gb: float
    cold_start_s: float
    job_queue: str | None = None
    job_definition: str | None = None
    capacity: PoolCapacity


class PoolList(_Out):
    pools: list[PoolView]


class ModelView(_Out):
    """A model jobs may name in ``workload.model``."""

    name: str
    builtin: bool = Field(False, description="built by the runtime itself (not published, not pinned)")
    content_hash: str | None = Field(
        None, description="the SHA-256 of its manifest: what a job naming it is pinned to at submission (model_hash)")
    source: str | None = Field(
        None, description="published (in the deployment's models bucket) or local (on the nodes' local model roots)")
    files: int | None = None


class ModelList(_Out):
    models: list[ModelView]


class AttemptView(_Out):
    """One attempt (fencing epoch) of a job, as the scheduler placed it."""

    epoch: int
    state: str | None = None
    created_at: str | None = None
    pool: str | None = None
    node: str | None = None
    target: str | None = None
    crash: dict[str, Any] | None = Field(None, description="the worker's crash report (exit code, last lines)")


class JobInspection(_Out):
    """Everything an operator needs to judge a quarantined or failed job."""

    job: JobView
    attempts: list[AttemptView]
    failures: list[dict[str, Any]] = Field(description="classified failures, oldest first: epoch, class, reason, action")
    crashed_workers: list[str] = Field(description="distinct workers the job crashed (quarantine counts these)")
    failed_nodes: list[str] = Field(description="on-prem nodes of attempts whose worker was lost")
    last_failure: dict[str, Any] | None = None
    events: list[EventView]
    logs: list[LogLine] = Field(description="the first page of the job's worker logs")


class RecoveryRequest(BaseModel):
    """Body of an operator recovery action (optional)."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=500, description="recorded on the job and its timeline")


class JobArrayRequest(BaseModel):
    """``POST /v1/job-arrays``: ``count`` jobs from one spec; every string of the spec has ``placeholder``
    replaced by the element's index (0-based)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="a JobSpec; each element's substituted spec must validate")
    count: int = Field(ge=1, le=48, description="number of elements (at most 48: one transaction)")
    placeholder: str = Field("{index}", min_length=1, max_length=32)


class JobArrayView(_Out):
    array_id: str
    count: int
    job_ids: list[str] = Field(description="element i is job_ids[i]")


class BulkCancelRequest(BaseModel):
    """``POST /v1/jobs/cancel``: cancel every unfinished job of the caller's tenant matching ALL given selectors."""

    model_config = ConfigDict(extra="forbid")

    array_id: str | None = Field(None, max_length=64)
    labels: dict[str, str] | None = Field(None, description="every pair must equal the job's label")


class BulkCancelView(_Out):
    matched: int = Field(description="unfinished jobs that matched")
    cancelled: list[str] = Field(description="jobs now cancel-requested (including ones that already were)")
    skipped: list[dict[str, Any]] = Field(default_factory=list, description="jobs that ended before the request")


class CostGroup(_Out):
    key: str = Field(description="the group: tenant, tenant/team, tenant/team/user, label value or pool")
    charged_usd: str = Field(description="sum of charged ledger entries (decimal string, to 1e-6 USD)")
    charged_gpu_seconds: float
    charged_attempts: int
    waived_usd: str = Field(description="what the waived attempts would have cost at their pool's price")
    waived_gpu_seconds: float
    waived_attempts: int


class CostReport(_Out):
    tenant: str
    by: str
    since: str | None = None
    until: str | None = None
    groups: list[CostGroup]
    total: CostGroup


class DiagnosisCause(_Out):
    cause: str = Field(description="computing, model_load, staging, checkpoint, post_processing, starting, held_idle, "
                       "unreported, free_fragmentation, free_quota, free_affinity, free_sched_latency, "
                       "free_head_of_line, free_no_work or drained (docs/operations.md)")
    gpu_seconds: float
    share: float = Field(description="of the window's GPU-seconds")
    lost: bool = Field(description="false for computing and free_no_work")
    meaning: str
    fix: str = Field(description="the likely fix")


class DiagnosisLane(_Out):
    node: str
    pool: str
    gpu: int
    segments: list[list[Any]] = Field(description="[start, end, cause, job id or null], epoch seconds, in order")


class FleetGpu(_Out):
    index: int
    memory_gb: float
    milli_free: int = Field(description="free milli-GPUs the node's last heartbeat reported")


class FleetNode(_Out):
    """One on-prem node now (gpufleet.diagnose.fleet)."""

    node_id: str
    pool: str
    gpu_type: str
    state: Literal["ready", "draining", "lost"] = Field(description="lost: its heartbeat expired")
    heartbeat_at: str | None = None
    expires_at: int = Field(description="epoch seconds the last heartbeat is good until")
    gpus: list[FleetGpu]
    resident_models: list[str] = Field(description="loaded in a warm worker")
    cached_models: list[str] = Field(description="on the node's disk")
    running_jobs: int
    labels: dict[str, str]


class DiagnosisReport(_Out):
    """Every GPU-second of the window on the nodes given to one cause, the lost causes ranked first."""

    start: float
    end: float
    gpus: int
    gpu_seconds: float
    utilisation: float = Field(description="computing share of the window's GPU-seconds")
    causes: list[DiagnosisCause]
    pools: dict[str, dict[str, float]] = Field(description="pool -> cause -> GPU-seconds")
    nodes: dict[str, dict[str, float]] = Field(description="node -> cause -> GPU-seconds")
    lanes: list[DiagnosisLane] | None = Field(None, description="with lanes=true: one lane per GPU (the timeline)")
    fleet: list[FleetNode] | None = Field(None, description="with fleet=true: each node's state, GPUs and models now")
    truncated: bool = Field(False, description="more attempts touched the window than were read")


class WebhookSecretView(_Out):
    id: str
    secret: str = Field(description="whsec_<base64>: verify deliveries with it (Standard Webhooks)")
    created_at: str
    expires_at: str | None = Field(None, description="when a rotated-out secret stops signing; null: current")
    current: bool


class WebhookSecrets(_Out):
    """The tenant's live signing secrets, the current one first; during a rotation's overlap every delivery
    carries one signature per secret listed."""

    tenant: str
    secrets: list[WebhookSecretView]


class RotateSecret(BaseModel):
    model_config = ConfigDict(extra="forbid")

    overlap_seconds: int = Field(86400, ge=0, le=7 * 24 * 3600,
                                 description="how long the previous secret keeps signing (0: stops at once)")


class WebhookEndpointRequest(BaseModel):
    """``POST /v1/webhooks/endpoints``: an endpoint receiving the events of every job of the tenant that
    matches (kind in ``events`` and every ``labels`` pair on the job)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048,
                     description="https (http only where the deployment allows private targets); the same URL "
                     "policy as a job's spec.webhook.url")
    events: list[WebhookEvent] = Field(default_factory=lambda: [WebhookEvent.COMPLETED], min_length=1,
                                       max_length=len(WebhookEvent),
                                       description="started | progress | completed (the per-job vocabulary)")
    description: str = Field("", max_length=256)
    labels: dict[str, str] = Field(default_factory=dict, max_length=16,
                                   description="label selector: only jobs carrying every pair (empty: all jobs)")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not (1 <= len(k) <= 63) or len(val) > 63:
                raise ValueError("label keys are 1-63 characters, values at most 63")
        return v


class WebhookEndpointPatch(BaseModel):
    """``PATCH /v1/webhooks/endpoints/{id}``: disable or enable the endpoint."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool


class WebhookEndpointView(_Out):
    id: str = Field(description="we_<ulid>")
    url: str
    events: list[str]
    labels: dict[str, str] = Field(default_factory=dict)
    description: str = ""
    enabled: bool
    created_at: str
    updated_at: str


class WebhookEndpointPage(_Out):
    endpoints: list[WebhookEndpointView]
    next_cursor: str | None = Field(None, description="opaque; pass as `cursor` for the next page; null at the end")
