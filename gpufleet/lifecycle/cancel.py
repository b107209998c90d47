"""Cancellation propagation (I/O), called by the API's DELETE handler after ``request_cancel``.

Contract (docs/contracts.md "Cancellation"): given the job item *after* ``cancel_requested`` was
set, :func:`propagate` tells whoever holds the job:

- parked on the placement token (PENDING with ``placement_token``) → ``SendTaskFailure(error=
  "CANCELLED")`` on that token; the workflow's ClassifyFailure records CANCELLED (not charged);
- running in the cloud (SCHEDULED/RUNNING/FINALIZING, ``placement.target == "cloud"``) → the
  attempt's Batch jobs (named ``<job_id>-e<epoch>`` and ``...-finalize``) are terminated;
- running on-prem (SCHEDULED/RUNNING/FINALIZING, ``placement.target == "onprem"``) → each node of the
  placement (a gang's every member) gets a nudge on its signal queue (``signals``,
  :class:`gpufleet.store.queues.SqsNodeSignals`): the agent heartbeats that attempt at once, reads
  ``cancel_requested`` from the node API's answer, stops the job and reports ``CANCELLED`` with the consumed
  time. The nudge carries no authority and may be lost: the agent's own heartbeat (``heartbeat_interval_s``)
  still sees the cancel;
- anywhere else (CheckPrompt, Backoff, CompleteRun, Publish) → the next task raises ``Cancelled``.

The workflow then records CANCELLED, bills consumed time and releases quota. A token or Batch job
that is already gone is not an error (the workflow moved on). StopExecution is deliberately not
used: it would end the execution without recording CANCELLED (and moto cannot stop an execution
parked on a task token). Returns what was done, for the event timeline and tests. The AWS calls go
through :mod:`gpufleet.store.workflow` (``tokens``: Step Functions, ``batch``: AWS Batch).
"""

from __future__ import annotations

from typing import Any

from gpufleet.placement import Placement
from gpufleet.status import JobStatus
from gpufleet.store.queues import NodeSignals
from gpufleet.store.workflow import BatchJobs, TaskTokens

RUNNING = (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.FINALIZING)
REASON = "cancelled by user"


def propagate(
    job: dict[str, Any], *, tokens: TaskTokens | None = None, batch: BatchJobs | None = None,
    finalize_queue: str | None = None, signals: NodeSignals | None = None, nudge: bool = True,
) -> dict[str, Any]:
    """Tell the job's current holder that it was cancelled (see module contract). ``nudge``: False for a repeated
    cancel, which sends the nodes nothing more (the first request's nudge, or the agents' heartbeats, carry it)."""
    if not job.get("cancel_requested"):
        raise ValueError("propagate() needs a job with cancel_requested set")
    status = JobStatus(job["status"])
    done: dict[str, Any] = {"job_id": job["job_id"], "status": status.value, "actions": []}
    if status.is_terminal():
        return done
    token = job.get("placement_token")
    if status is JobStatus.PENDING and token and tokens is not None:
        sent = tokens.fail(token, "CANCELLED", {"detail": REASON})
        done["actions"].append("placement_token_failed" if sent else "placement_token_gone")
    placement = Placement.parse(job.get("placement"))
    target = placement.target if placement else None
    if placement and status in RUNNING and target == "cloud" and batch is not None:
        epoch = placement.epoch or int(job.get("current_epoch", 0))
        names = {f"{job['job_id']}-e{epoch}": placement.job_queue}
        if finalize_queue:
            names[f"{job['job_id']}-e{epoch}-finalize"] = finalize_queue
        for name, queue in names.items():
            if queue:
                done["actions"] += [f"batch_terminated:{i}" for i in batch.terminate_named(queue, name, REASON)]
    if placement and status in RUNNING and target == "onprem":
        done["actions"].append("agent_notified_via_job_item")
        epoch = placement.epoch or int(job.get("current_epoch", 0))
        queues = sorted({m.queue_url for m in placement.members or [] if m.queue_url} | (
            {placement.queue_url} if placement.queue_url else set()))
        if signals is not None and queues and not nudge:
            done["actions"].append("node_nudge_skipped:repeat")
        for url in queues if signals is not None and nudge else ():
            sent = signals.nudge(url, job["job_id"], epoch)
            done["actions"].append(f"node_nudged:{url.rsplit('/', 1)[-1]}" if sent else "node_nudge_failed")
    return done
