"""The job as the job store returns it: the job item's attributes, typed (pydantic, no AWS imports).

Contract: :meth:`JobRecord.from_item` parses a job item (a read of the jobs table or a stream image).
Key and index plumbing, and any attribute this model does not name, are ignored, so an item written
by an older or newer version still parses. ``spec`` is the job's :class:`gpufleet.spec.JobSpec` — its
defaults are the only spec defaults, nobody re-reads them from the stored dict — and ``placement`` the
current attempt's :class:`gpufleet.placement.Placement` (``None`` before the first placement).

Attributes, by writer:

- submission (``store.jobs.build_job``): ``job_id``, ``tenant``, ``team``, ``user``, ``owner_path``,
  ``status``, ``spec``, ``priority``, ``created_at``, ``updated_at``, ``current_epoch``,
  ``attempt_count``, ``preemptions``, ``system_failures``, ``cancel_requested``; the API: ``traceparent``
  (:mod:`gpufleet.tracing`; absent on jobs submitted before tracing);
- scheduler: ``placement``, ``scheduled_at``, ``sched_backoff_until``, ``sched_reason``,
  ``sched_attempts``, ``sched_shape``, ``last_preempted_at``; the lifecycle: ``placement_token``, ``last_run`` (``{"epoch", "gpu_seconds", "phases", "finalizing_at"}``),
  ``last_failure``, ``crashed_workers``, ``failed_nodes``, ``final``, ``published_at``, ``billing``,
  ``safety`` (the frozen tier-2 settings);
- the worker: ``running_since`` (epoch seconds), ``heartbeat_at``, ``progress``, ``generated``
  (``{"key", "sha256"}``), ``moderation``, ``output``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.placement import Placement
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus


class JobRecord(BaseModel):
    """One job item, typed (see the module contract)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    tenant: str
    team: str
    user: str
    owner_path: str = Field("", description="<tenant>/<team>/<user> (filled in when an item lacks it)")
    status: JobStatus
    spec: JobSpec
    priority: int
    created_at: str
    updated_at: str
    current_epoch: int = Field(0, ge=0)
    attempt_count: int = Field(0, ge=0)
    preemptions: int = Field(0, ge=0)
    system_failures: int = Field(0, ge=0)
    cancel_requested: bool = False
    placement: Placement | None = None
    placement_token: str | None = None
    scheduled_at: str | None = None
    sched_backoff_until: float | None = None
    sched_reason: str | None = None
    #: UNRESOLVABLE/ERROR decisions the scheduler recorded (its backoff's exponent)
    sched_attempts: int = Field(0, ge=0)
    #: the cluster shape the last UNRESOLVABLE backoff was judged on (gpufleet.scheduler.shape); "" none
    sched_shape: str | None = None
    last_preempted_at: float | None = None
    running_since: float | None = None
    heartbeat_at: str | None = None
    progress: dict[str, Any] | None = None
    generated: dict[str, Any] | None = None
    last_run: dict[str, Any] | None = None
    last_failure: dict[str, Any] | None = None
    crashed_workers: frozenset[str] = frozenset()
    failed_nodes: frozenset[str] = frozenset()
    #: recorded crashes ``<fingerprint>|<worker>`` (gpufleet.lifecycle.decide.Accounting.crashes)
    crashes: frozenset[str] = frozenset()
    moderation: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    published_at: str | None = None
    billing: dict[str, Any] | None = None
    safety: dict[str, Any] | None = None
    #: operator recovery (gpufleet.lifecycle.recovery): the run counter and the last action
    workflow_run: int = Field(0, ge=0)
    recovery: dict[str, Any] | None = None
    #: the terminal job this one retries (``POST /v1/jobs/{id}/retry``)
    retry_of: str | None = None
    #: a job array's id and this element's index (``POST /v1/job-arrays``)
    array_id: str | None = None
    array_index: int | None = None
    #: the job's W3C traceparent (:mod:`gpufleet.tracing`), set at submit
    traceparent: str | None = None
    #: the content hash a generate job's model must have, pinned from the model catalog at submit
    #: (:mod:`gpufleet.store.model_catalog`); None: a built-in model, a container job, or a job from before the catalog
    model_hash: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _owner_path(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("owner_path"):
            data = {**data, "owner_path": f"{data.get('tenant')}/{data.get('team')}/{data.get('user')}"}
        return data

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> JobRecord:
        """The record of a job item (plumbing and unknown attributes ignored; an empty placement is none)."""
        data = dict(item)
        data["placement"] = Placement.parse(data.get("placement"))
        return cls.model_validate(data)
