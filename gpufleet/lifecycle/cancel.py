"""Cancellation propagation (I/O), called by the API's DELETE handler after ``request_cancel``.

Contract (docs/contracts.md "Cancellation"): given the job item *after* ``cancel_requested`` was
set, :func:`propagate` tells whoever holds the job:

- parked on the placement token (PENDING with ``placement_token``) → ``SendTaskFailure(error=
  "CANCELLED")`` on that token; the workflow's ClassifyFailure records CANCELLED (not charged);
- running in the cloud (SCHEDULED/RUNNING/FINALIZING, ``placement.target == "cloud"``) → the
  attempt's Batch jobs (named ``<job_id>-e<epoch>`` and ``...-finalize``) are terminated;
- running on-prem → nothing to send: the agent reads ``cancel_requested`` on its next heartbeat,
  stops, and reports ``CANCELLED`` with the consumed time;
- anywhere else (CheckPrompt, Backoff, CompleteRun, Publish) → the next task raises ``Cancelled``.

The workflow then records CANCELLED, bills consumed time and releases quota. A token or Batch job
that is already gone is not an error (the workflow moved on). StopExecution is deliberately not
used: it would end the execution without recording CANCELLED (and moto cannot stop an execution
parked on a task token). Returns what was done, for the event timeline and tests.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.status import JobStatus
from gpufleet.store.dynamo import error_code

_GONE_TOKEN = {"TaskDoesNotExist", "TaskTimedOut", "InvalidToken"}
RUNNING = (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.FINALIZING)


def propagate(job: dict[str, Any], *, sfn=None, batch=None, finalize_queue: str | None = None) -> dict[str, Any]:
    """Tell the job's current holder that it was cancelled (see module contract)."""
    if not job.get("cancel_requested"):
        raise ValueError("propagate() needs a job with cancel_requested set")
    status = JobStatus(job["status"])
    done: dict[str, Any] = {"job_id": job["job_id"], "status": status.value, "actions": []}
    if status.is_terminal():
        return done
    token = job.get("placement_token")
    if status is JobStatus.PENDING and token and sfn is not None:
        try:
            sfn.send_task_failure(
                taskToken=token, error="CANCELLED", cause=json.dumps({"detail": "cancelled by user"})
            )
            done["actions"].append("placement_token_failed")
        except ClientError as err:
            if error_code(err) not in _GONE_TOKEN:
                raise
            done["actions"].append("placement_token_gone")
    placement = job.get("placement") or {}
    if status in RUNNING and placement.get("target") == "cloud" and batch is not None:
        epoch = int(placement.get("epoch") or job.get("current_epoch", 0))
        names = {f"{job['job_id']}-e{epoch}": placement.get("job_queue")}
        if finalize_queue:
            names[f"{job['job_id']}-e{epoch}-finalize"] = finalize_queue
        for name, queue in names.items():
            if not queue:
                continue
            listed = batch.list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [name]}])
            for summary in listed.get("jobSummaryList", []):
                if summary.get("status") in ("SUCCEEDED", "FAILED"):
                    continue
                batch.terminate_job(jobId=summary["jobId"], reason="cancelled by user")
                done["actions"].append(f"batch_terminated:{summary['jobId']}")
    if status in RUNNING and placement.get("target") == "onprem":
        done["actions"].append("agent_notified_via_job_item")
    return done
