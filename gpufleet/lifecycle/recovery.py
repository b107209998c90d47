"""Operator recovery of ended jobs: release or close a quarantined job, re-finalize a finalize failure.

Contract (docs/lifecycle.md "Recovery", docs/operations.md runbook):
- :func:`plan_release` (pure): a QUARANTINED job goes back to QUEUED with a fresh failure budget
  (``system_failures`` 0, ``crashed_workers`` and ``crashes`` forgotten; ``failed_nodes`` kept, so
  the scheduler still avoids the nodes that lost it while it can) and ``final`` removed. It starts
  a new workflow run from the top (CheckPrompt → AwaitPlacement → ...): the next attempt gets a new
  epoch from the scheduler and resumes from the job's last valid checkpoint.
- :func:`plan_close` (pure): a QUARANTINED job is closed out as CANCELLED (it stays uncharged).
- :func:`plan_refinalize` (pure): a FAILED job whose finalize or publish ran out of retries
  (``final.outcome`` SYSTEM_FAILURE, reason ``finalize failed: ...``) and whose generation is persisted
  (``generated`` on the item, ``last_run`` of the current epoch) goes to FINALIZING at the SAME epoch
  and starts a run that executes only Finalize → Publish → Bill (the workflow's ``ResumeFinalize``
  entry). Inference is never re-run; the write is fenced on the epoch, so a job that moved on since
  the operator looked cannot be re-finalized from a stale view.
- Every plan bumps ``workflow_run`` (conditioned on the run the operator observed): the outbox
  (:mod:`gpufleet.outbox`) starts exactly one execution per run, named ``<job_id>-run<n>``, so a
  repeated or concurrent operator request lands once and the others get :class:`InvalidTransition`.
- :func:`apply` performs a plan as one conditional status move through the job store
  (``operator=True``: the moves of :data:`gpufleet.status.REOPEN`) with a ``recovery`` event detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.clock import iso
from gpufleet.errors import InvalidTransition
from gpufleet.jobrecord import JobRecord
from gpufleet.status import JobStatus
from gpufleet.store.guard import Guard

if TYPE_CHECKING:
    from gpufleet.store.jobs import JobStore

S = JobStatus
#: what the plans set and remove on the job item (with the ``workflow_run`` guard): infra.grants binds the API's
#: UpdateItem to these, its cancel request and its status moves
WRITES = ("workflow_run", "release_count", "refinalize_count", "system_failures", "cancel_requested", "recovery",
          "crashed_workers", "crashes", "final", "placement_token", "last_run")
#: what MarkFinalizeFailed writes as ``final.reason`` (gpufleet.lifecycle.steps.mark_terminal, stage "finalize")
FINALIZE_FAILED = "finalize failed"


@dataclass(frozen=True)
class Plan:
    """One operator recovery move, as data (what :func:`apply` writes)."""

    action: str  # release | close | refinalize
    job_id: str
    from_status: JobStatus
    to_status: JobStatus
    run: int  # the workflow run the operator observed
    set_attrs: dict[str, Any] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    epoch: int | None = None
    starts_run: bool = True


def _run(item: dict[str, Any]) -> int:
    return int(item.get("workflow_run") or 0)


def _require(job: JobRecord, status: JobStatus, action: str) -> None:
    if job.status is not status:
        raise InvalidTransition(
            f"job {job.job_id} is {job.status.value}; {action} needs a {status.value} job",
            current_status=job.status.value,
        )


def _audit(action: str, by: str, now: float, reason: str | None, run: int) -> dict[str, Any]:
    return {"action": action, "by": by, "at": iso(now), "reason": reason, "run": run}


def plan_release(job: JobRecord, item: dict[str, Any], *, by: str, now: float, reason: str | None = None) -> Plan:
    """Re-queue a QUARANTINED job with a fresh failure budget (module contract)."""
    _require(job, S.QUARANTINED, "release")
    run = _run(item)
    released = int(item.get("release_count") or 0) + 1
    return Plan(
        "release", job.job_id, S.QUARANTINED, S.QUEUED, run,
        set_attrs={
            "workflow_run": run + 1, "release_count": released, "system_failures": 0,
            "cancel_requested": False, "recovery": _audit("release", by, now, reason, run + 1),
        },
        remove=("crashed_workers", "crashes", "final", "placement_token", "last_run"),
    )


def plan_close(job: JobRecord, item: dict[str, Any], *, by: str, now: float, reason: str | None = None) -> Plan:
    """Close a QUARANTINED job out as CANCELLED (no new run; it stays uncharged)."""
    _require(job, S.QUARANTINED, "cancel")
    run = _run(item)
    return Plan("close", job.job_id, S.QUARANTINED, S.CANCELLED, run,
                set_attrs={"recovery": _audit("close", by, now, reason, run)}, starts_run=False)


def plan_refinalize(job: JobRecord, item: dict[str, Any], *, by: str, now: float, reason: str | None = None) -> Plan:
    """Re-run Finalize → Publish → Bill of a FAILED job from its persisted generation (module contract)."""
    _require(job, S.FAILED, "refinalize")
    final = job.final or {}
    if final.get("outcome") != "SYSTEM_FAILURE" or not str(final.get("reason") or "").startswith(FINALIZE_FAILED):
        raise InvalidTransition(
            f"job {job.job_id} did not fail in finalize/publish ({final.get('reason') or 'no reason'}); "
            "only a job whose finalize ran out of retries can be re-finalized (use retry for a new job)",
            current_status=job.status.value,
        )
    epoch = job.current_epoch
    last_run = job.last_run or {}
    if not job.generated or int(last_run.get("epoch", -1)) != epoch or job.placement is None:
        raise InvalidTransition(
            f"job {job.job_id} has no persisted generation of its current attempt (epoch {epoch}); "
            "nothing to re-finalize", current_status=job.status.value,
        )
    run = _run(item)
    return Plan(
        "refinalize", job.job_id, S.FAILED, S.FINALIZING, run,
        set_attrs={
            "workflow_run": run + 1,
            "refinalize_count": int(item.get("refinalize_count") or 0) + 1,
            "recovery": {**_audit("refinalize", by, now, reason, run + 1), "epoch": epoch},
        },
        remove=("final",),
        epoch=epoch,
    )


def apply(jobs: JobStore, plan: Plan) -> dict[str, Any]:
    """Write ``plan`` as one conditional operator move (status, observed run, epoch); returns the job.
    A job that changed since it was read (another operator, a second click) → :class:`InvalidTransition`."""
    detail = {"recovery": plan.action, "run": plan.run + (1 if plan.starts_run else 0),
              "by": plan.set_attrs.get("recovery", {}).get("by")}
    return jobs.transition(
        plan.job_id, [plan.from_status], plan.to_status, plan.set_attrs, detail=detail, remove=plan.remove,
        epoch=plan.epoch, guard=Guard(workflow_run=plan.run), operator=True,
    )


def execution_name(job_id: str, run: int) -> str:
    """The Step Functions execution name of a job's workflow run (run 0: the job id itself)."""
    return job_id if run <= 0 else f"{job_id}-run{run}"
