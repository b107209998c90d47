"""Typed results returned by :class:`gpufleet.sdk.Client` (pydantic v2).

The models name the fields callers rely on and keep any other field the API adds
(``extra="allow"``), so a newer server never breaks an older client. Field names follow
the API's JSON (docs/api.md); a few tolerated aliases (``id`` for ``job_id``, ``items`` for
``jobs``) are normalised before validation.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.status import JobStatus


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Progress(_Result):
    step: int = 0
    total: int = 0

    @property
    def fraction(self) -> float:
        return self.step / self.total if self.total else 0.0


class Job(_Result):
    """A job as the API shows it."""

    job_id: str
    status: JobStatus
    spec: dict[str, Any] | None = None
    created_at: str | None = None
    updated_at: str | None = None
    progress: Progress | None = None
    placement: dict[str, Any] | None = None
    #: a gang's members: ``[{"node", "rank", "gpus", "state"}]`` (rank order)
    members: list[dict[str, Any]] | None = None
    billing: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    owner: str | None = None
    #: the last run that finished: ``{"epoch", "gpu_seconds", "phases": {"durations", ...}}``
    last_run: dict[str, Any] | None = None
    #: only while PENDING: ``{"reason", "retry_at"}``, why the scheduler has not placed the job
    scheduling: dict[str, Any] | None = None
    #: the ended job this one retries; a job array's id and this element's index
    retry_of: str | None = None
    array_id: str | None = None
    array_index: int | None = None
    #: the last operator recovery action (release, refinalize, close)
    recovery: dict[str, Any] | None = None
    #: the job's W3C trace (docs/operations.md, "Tracing")
    traceparent: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and "job_id" not in data and "id" in data:
            data = {**data, "job_id": data["id"]}
        return data

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal()

    @property
    def workload(self) -> dict[str, Any]:
        """The spec's workload as the API returned it (``{}`` when absent). The client keeps the API's
        JSON as is (a newer server may add fields), so this is not a :class:`gpufleet.spec.JobSpec`."""
        return (self.spec or {}).get("workload") or {}

    @property
    def prompt(self) -> str | None:
        return self.workload.get("prompt")


class JobPage(_Result):
    """One page of ``GET /v1/jobs``; ``next_cursor`` is ``None`` on the last page."""

    jobs: list[Job] = Field(default_factory=list)
    next_cursor: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "jobs" not in data and "items" in data:
                data["jobs"] = data.pop("items")
            if "next_cursor" not in data and "cursor" in data:
                data["next_cursor"] = data.pop("cursor")
        return data


class Event(_Result):
    """One entry of a job's timeline."""

    ts: str | None = None
    type: str | None = None
    status: str | None = None
    detail: Any = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for alt in ("at", "timestamp", "time"):
                if "ts" not in data and alt in data:
                    data["ts"] = data[alt]
            if "type" not in data and "event" in data:
                data["type"] = data["event"]
        return data

    @property
    def label(self) -> str:
        return self.type or self.status or "event"


class Delivery(_Result):
    """One try at delivering a webhook event to the job's URL, as the webhook sender logged it.

    ``status_code`` is the receiver's HTTP status (0: no response, e.g. connection refused).
    ``next_retry_at`` is when the sender tries again after a failure (``None`` once delivered or
    when retries are exhausted); ``dead_lettered`` marks a final failure. ``msg_id`` is the same
    for every try of one event. The documented names ``ts``/``event``/``ok`` are accepted for
    ``at``/``event_type``/``delivered``.
    """

    at: str | None = None
    event_type: str | None = None
    attempt: int | None = None
    status_code: int | None = None
    delivered: bool | None = None
    next_retry_at: str | None = None
    dead_lettered: bool | None = None
    url: str | None = None
    msg_id: str | None = None
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for alt, name in (("ts", "at"), ("event", "event_type"), ("ok", "delivered")):
                if alt in data:
                    value = data.pop(alt)
                    if data.get(name) is None:
                        data[name] = value
        return data


class LogLine(_Result):
    ts: str | None = None
    level: str | None = None
    msg: str = ""
    epoch: int | None = None


class LogPage(_Result):
    """Log lines after a position; pass ``next`` back as ``after`` to follow."""

    lines: list[LogLine] = Field(default_factory=list)
    next: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for alt in ("next_after", "after", "cursor", "next_cursor"):
                if "next" not in data and alt in data:
                    data["next"] = data[alt]
            if "lines" not in data and "items" in data:
                data["lines"] = data.pop("items")
        return data


class OutputFile(_Result):
    path: str
    bytes: int = 0
    url: str


class Output(_Result):
    """Presigned download links of a SUCCEEDED job (valid for at most 15 minutes): the video (``kind``
    video) or every file a container job wrote under its output directory (``kind`` files)."""

    job_id: str | None = None
    kind: str = "video"
    video_url: str | None = None
    manifest_url: str | None = None
    expires_at: str | None = None
    watermark_payload: str | None = None
    files: list[OutputFile] = []
    total_bytes: int | None = None


class Quota(_Result):
    """The caller's quota and usage up the tenant → team → user tree (shape per docs/api.md)."""


class Pool(_Result):
    name: str
    kind: str | None = None
    gpu_type: str | None = None
    max_gpus: float | None = None
    price_per_gpu_hour: float | None = None


class Model(_Result):
    """A model jobs may name (``GET /v1/models``): built in, or from the deployment's model catalog."""

    name: str
    builtin: bool = False
    content_hash: str | None = None
    source: str | None = None
    files: int | None = None


class ProvenanceMatch(_Result):
    """A delivered video whose watermark a questioned copy carries, and links to its kept manifest."""

    job_id: str
    published_at: str | None = None
    watermark_key_id: str | None = None
    video_sha256: str | None = None
    manifest_url: str
    video_url: str | None = None
    own: bool = False


class ProvenanceLookup(_Result):
    """What ``POST /v1/provenance/lookup`` found: the platform's watermark (``found``) and its jobs."""

    found: bool
    watermark_payload: str | None = None
    watermark_key_id: str | None = None
    sync_z: float = 0.0
    scale: float | None = None
    flipped: bool | None = None
    matches: list[ProvenanceMatch] = []
    expires_at: str | None = None
