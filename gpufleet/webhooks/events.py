"""Webhook events, the per-job event filter and the retry schedule (pure).

Contract:
- Event types: ``job.started``, ``job.progress``, ``job.completed`` (any terminal status).
  The job's ``spec.webhook.events`` lists the wanted kinds (``started``, ``progress``,
  ``completed``; :class:`gpufleet.spec.Webhook` defaults it); :func:`wanted` applies it. Jobs
  are :class:`gpufleet.jobrecord.JobRecord` s.
- The message id (``webhook-id``) is derived from (job, kind, discriminator) so that a
  re-enqueued event keeps its id and receivers can de-duplicate.
- :data:`RETRY_SCHEDULE_S` (delay before attempt n+1) spans about 28 hours:
  5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (the Standard Webhooks reference schedule).
  SQS visibility timeouts go up to 12 h, so each step fits one ChangeMessageVisibility.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpufleet.jobrecord import JobRecord
from gpufleet.spec import JobSpec

KINDS = ("started", "progress", "completed")
RETRY_SCHEDULE_S: tuple[int, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)
MAX_VISIBILITY_S = 12 * 3600


def wanted(spec: JobSpec, kind: str) -> str | None:
    """The webhook URL if the job's spec subscribes to ``kind``, else None."""
    if kind not in KINDS:
        raise ValueError(f"unknown webhook event kind {kind!r}")
    hook = spec.webhook
    return str(hook.url) if hook is not None and kind in hook.events else None


def message_id(job_id: str, kind: str, discriminator: str = "") -> str:
    digest = hashlib.sha256(f"{job_id}|{kind}|{discriminator}".encode()).hexdigest()[:24]
    return f"msg_{digest}"


def build(job: JobRecord, kind: str, ts: str, discriminator: str = "") -> dict[str, Any]:
    """The queued event: delivery metadata plus the JSON body the receiver gets."""
    data: dict[str, Any] = {"job_id": job.job_id, "status": job.status.value}
    if kind == "progress" and job.progress:
        data["progress"] = job.progress
    if kind == "completed":
        if job.output:
            data["output"] = {k: v for k, v in job.output.items() if k != "watermark_payload"}
        if job.billing:
            data["billing"] = job.billing
    body = {"type": f"job.{kind}", "timestamp": ts, "data": data}
    return {
        "msg_id": message_id(job.job_id, kind, discriminator or job.status.value),
        "job_id": job.job_id,
        "tenant": job.tenant,
        "kind": kind,
        "url": wanted(job.spec, kind),
        "body": json.dumps(body, separators=(",", ":"), sort_keys=True),
    }


def retry_delay(attempt: int) -> int | None:
    """Delay after failed attempt number ``attempt`` (1-based), or None when retries are exhausted."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if attempt > len(RETRY_SCHEDULE_S):
        return None
    return min(RETRY_SCHEDULE_S[attempt - 1], MAX_VISIBILITY_S)


def from_change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Webhook events implied by one change of a job item (a jobs-table stream MODIFY record).

    Returns ``(kind, discriminator)`` pairs: ``started`` when the status becomes RUNNING (once per
    epoch), ``progress`` when ``progress.step`` changes (once per epoch and step). ``completed`` is
    not derived here: the workflow's Notify state sends it after billing. Items other than the job
    item (``sk`` != ``META``) give nothing.
    """
    if not new or new.get("sk") != "META":
        return []
    old = old or {}
    out: list[tuple[str, str]] = []
    epoch = str(new.get("current_epoch", 0))
    if new.get("status") == "RUNNING" and old.get("status") != "RUNNING":
        out.append(("started", f"e{epoch}"))
    step = (new.get("progress") or {}).get("step")
    if step is not None and step != (old.get("progress") or {}).get("step"):
        out.append(("progress", f"e{epoch}:s{step}"))
    return out
