"""Recovery operations of the API: quarantined jobs (list, inspect, release, cancel), re-finalize, retry.

Contract (docs/api.md "Recovery", docs/operations.md runbook):
- Operator actions (list/inspect quarantined jobs, release, cancel a quarantined job, refinalize)
  need an operator principal (``admin`` on the principal item, :mod:`gpufleet.store.principals`);
  any other caller gets 403 ``forbidden`` — decided here, server-side, never by the client. An
  operator acts on any tenant's job; listing takes the tenant to list (default: the operator's own).
- The moves themselves are :mod:`gpufleet.lifecycle.recovery` plans, written as one conditional
  write each (status, observed workflow run, epoch for refinalize); a stale or repeated request is
  409 with ``current_status``. The outbox starts the new run.
- :func:`retry` is a tenant action on the caller's own job (another tenant's job is 404): a terminal
  job is submitted again with the same spec under a new Idempotency-Key (required, as for submit);
  the new job records ``retry_of`` (shown by GET) and the original gets a ``retried`` event. The key's
  payload is ``{"retry_of": <job id>}``, so the same key replays the first retry.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.models import AttemptView, JobInspection, JobPage, JobView, LogLine
from gpufleet.api.service import Deps, HttpResult, submit
from gpufleet.errors import InvalidTransition, Unauthorized
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle import recovery
from gpufleet.spec import JobSpec, payload_hash
from gpufleet.status import JobStatus
from gpufleet.store import jobs as job_store
from gpufleet.store import objects
from gpufleet.store.principals import Principal

#: events an inspection shows (the newest)
INSPECT_EVENTS = 200


def require_operator(who: Principal, action: str) -> None:
    """403 unless the caller is an operator principal."""
    if not who.admin:
        raise Unauthorized(f"{action} is an operator action; this principal is not an operator")


def list_quarantined(deps: Deps, who: Principal, *, tenant: str | None, limit: int, cursor: str | None) -> JobPage:
    """``GET /v1/admin/quarantine``: one page of a tenant's QUARANTINED jobs, newest first."""
    require_operator(who, "listing quarantined jobs")
    items, nxt = deps.jobs.list(tenant=tenant or who.tenant, secret=deps.settings.cursor_key,
                                statuses=[JobStatus.QUARANTINED], limit=limit, cursor=cursor)
    return JobPage(jobs=[JobView.from_item(i) for i in items], next_cursor=nxt)


def _failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The classified failures of the timeline (``attempt_failed`` and the terminal classification)."""
    out = []
    for ev in events:
        d = ev.get("detail") or {}
        if ev["type"] == "attempt_failed" or (ev["type"] == "status" and "class" in d):
            out.append({"ts": ev["ts"], "epoch": d.get("epoch"), "class": d.get("class"), "reason": d.get("reason"),
                        "action": d.get("action"), "crash_fingerprint": d.get("crash_fingerprint")})
    return out


def inspect(deps: Deps, who: Principal, job_id: str) -> JobInspection:
    """``GET /v1/admin/jobs/{id}``: the job, its attempts (placement, node, state), classified failures,
    the nodes that crashed or lost it, recent events and the first page of its logs."""
    require_operator(who, "inspecting a job")
    item = deps.jobs.get(job_id)
    job = JobRecord.from_item(item)
    events = deps.jobs.events(job_id)
    attempts = []
    for a in deps.jobs.attempts(job_id):
        placement = a.get("placement") or {}
        attempts.append(AttemptView(epoch=int(a.get("epoch", 0)), state=a.get("state"), created_at=a.get("created_at"),
                                    pool=placement.get("pool"), node=placement.get("node"),
                                    target=placement.get("target"), crash=a.get("crash")))
    lines: list[LogLine] = []
    if deps.s3 is not None and deps.settings.logs_bucket:
        raw, _ = objects.read_log_chunks(deps.s3, deps.settings.logs_bucket, job_id, None,
                                         max_chunks=deps.settings.log_chunks_per_page)
        lines = [LogLine.model_validate(x) for x in raw]
    return JobInspection(
        job=JobView.from_item(job_store.public(item)),
        attempts=attempts,
        failures=_failures(events),
        crashed_workers=sorted(job.crashed_workers),
        failed_nodes=sorted(job.failed_nodes),
        last_failure=job.last_failure,
        events=[{"ts": e["ts"], "type": e["type"], "detail": e.get("detail") or {}} for e in events[-INSPECT_EVENTS:]],
        logs=lines,
    )


def _act(deps: Deps, who: Principal, job_id: str, planner, action: str, reason: str | None) -> JobView:
    require_operator(who, action)
    item = deps.jobs.get(job_id)
    plan = planner(JobRecord.from_item(item), item, by=who.arn, now=deps.clock.now(), reason=reason)
    return JobView.from_item(job_store.public(recovery.apply(deps.jobs, plan)))


def release(deps: Deps, who: Principal, job_id: str, reason: str | None = None) -> JobView:
    """``POST /v1/admin/jobs/{id}/release``: QUARANTINED → QUEUED with a fresh failure budget, a new run."""
    return _act(deps, who, job_id, recovery.plan_release, "release", reason)


def close(deps: Deps, who: Principal, job_id: str, reason: str | None = None) -> JobView:
    """``POST /v1/admin/jobs/{id}/cancel``: a QUARANTINED job is closed out as CANCELLED."""
    return _act(deps, who, job_id, recovery.plan_close, "cancelling a quarantined job", reason)


def refinalize(deps: Deps, who: Principal, job_id: str, reason: str | None = None) -> JobView:
    """``POST /v1/admin/jobs/{id}/refinalize``: FAILED (finalize exhausted) → FINALIZING; Finalize → Publish
    → Bill run again from the persisted generation, fenced on the job's epoch."""
    return _act(deps, who, job_id, recovery.plan_refinalize, "refinalize", reason)


def retry(deps: Deps, who: Principal, job_id: str, idempotency_key: str | None,
          traceparent: str | None = None) -> HttpResult:
    """``POST /v1/jobs/{id}/retry``: a new job from a terminal one of the caller's tenant (module contract)."""
    item = deps.jobs.get(job_id, who.tenant)
    status = JobStatus(item["status"])
    if not status.is_terminal():
        raise InvalidTransition(f"job {job_id} is {status.value}; only an ended job can be retried",
                                current_status=status.value)
    spec = JobSpec.model_validate(item["spec"])
    res = submit(deps, who, spec, idempotency_key, attrs={"retry_of": job_id},
                 fingerprint=payload_hash({"retry_of": job_id}), traceparent=traceparent)
    if not res.replayed and res.job_id:
        deps.jobs.append_event(job_id, "retried", {"job_id": res.job_id, "by": who.arn})
    return res
