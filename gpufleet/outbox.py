"""Transactional outbox: the jobs table's stream starts each new job's workflow exactly once.

Contract:
- :func:`jobs_to_start` (pure) picks, from DynamoDB stream records, the jobs
  that were just inserted (``INSERT`` of a ``JOB#<id>`` / ``META`` item), and the jobs an operator
  reopened (``MODIFY`` whose ``workflow_run`` went up: :mod:`gpufleet.lifecycle.recovery`).
- :func:`start_workflow` starts the state machine with execution name = job id
  (run ``n`` > 0: ``<job id>-run<n>``) and input ``{"job_id": ...}`` (a reopened run adds
  ``"run": n``; a re-finalize, whose new image is FINALIZING, adds ``"resume": "finalize"``, which
  the definition's ``StartOrResume`` routes straight to ``ResumeFinalize``). A start for a run that
  already has an execution (a redelivered stream record, a retried batch) is a no-op that
  reports ``already_started``; the first run's execution ARN is recorded on the job once. Every run
  starts in the job's trace (its ``traceparent`` as X-Ray ``traceHeader``, :mod:`gpufleet.tracing`).
  The AWS calls are :mod:`gpufleet.store.workflow`.
- :func:`process` handles one stream batch and returns the Lambda
  partial-batch response: records that failed are reported by sequence number
  so only they are retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpufleet import tracing
from gpufleet.errors import GpufleetError
from gpufleet.lifecycle.recovery import execution_name
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.workflow import record_execution_arn, start_execution
from gpufleet.tables import JOB_META, JOB_PREFIX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    job_id: str
    execution_arn: str
    outcome: str  # "started" | "already_started"


@dataclass(frozen=True)
class ToStart:
    """One workflow run to start: the job, its run number and where the run begins."""

    seq: str
    job_id: str
    run: int = 0
    resume: str | None = None  # "finalize": Finalize → Publish → Bill only
    traceparent: str | None = None  # the job's trace (gpufleet.tracing): the execution joins it


def _job_image(image: dict[str, Any]) -> bool:
    return image.get("sk") == JOB_META and str(image.get("pk", "")).startswith(JOB_PREFIX) and bool(image.get("job_id"))


def runs_to_start(records: list[dict[str, Any]]) -> list[ToStart]:
    """Every workflow run the records ask for (module contract)."""
    out = []
    for rec in records:
        ddb = rec.get("dynamodb") or {}
        seq = str(ddb.get("SequenceNumber", ""))
        new = unmarshal(ddb.get("NewImage")) or {}
        if not _job_image(new):
            continue
        if rec.get("eventName") == "INSERT":
            out.append(ToStart(seq, new["job_id"], traceparent=new.get("traceparent")))
        elif rec.get("eventName") == "MODIFY":
            old = unmarshal(ddb.get("OldImage")) or {}
            run = int(new.get("workflow_run") or 0)
            if run > int(old.get("workflow_run") or 0):
                resume = "finalize" if new.get("status") == "FINALIZING" else None
                out.append(ToStart(seq, new["job_id"], run, resume, new.get("traceparent")))
    return out


def jobs_to_start(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sequence number, job id) for every record that inserted a job item or reopened one."""
    return [(r.seq, r.job_id) for r in runs_to_start(records)]


def start_workflow(sfn, state_machine_arn: str, job_id: str, *, ddb=None, jobs_table: str | None = None,
                   run: int = 0, resume: str | None = None, traceparent: str | None = None) -> Started:
    """Start the run's execution (name = job id, or ``<job id>-run<n>``) in the job's trace (``traceparent``,
    passed as X-Ray ``traceHeader``); a duplicate start is a no-op."""
    payload: dict[str, Any] = {"job_id": job_id}
    if run:
        payload["run"] = run
    if resume:
        payload["resume"] = resume
    arn, started = start_execution(sfn, state_machine_arn, job_id, name=execution_name(job_id, run), payload=payload,
                                   trace_header=tracing.xray_header(traceparent))
    if ddb is not None and jobs_table and not run:
        record_execution_arn(ddb, jobs_table, job_id, arn)
    return Started(job_id, arn, "started" if started else "already_started")


def process(
    records: list[dict[str, Any]], sfn, state_machine_arn: str, *, ddb=None, jobs_table: str | None = None
) -> tuple[list[Started], dict[str, list[dict[str, str]]]]:
    """Start workflows for a stream batch; return what happened and the partial-batch response."""
    done: list[Started] = []
    failures: list[dict[str, str]] = []
    for want in runs_to_start(records):
        seq, job_id = want.seq, want.job_id
        try:
            done.append(start_workflow(sfn, state_machine_arn, job_id, ddb=ddb, jobs_table=jobs_table,
                                       run=want.run, resume=want.resume, traceparent=want.traceparent))
        except GpufleetError as err:
            log.error("could not start the workflow of %s: %s", job_id, err)
            failures.append({"itemIdentifier": seq})
    return done, {"batchItemFailures": failures}

