"""Job helpers shared by the workflow's tasks.

Contract (fenced status changes are ``JobStore.transition(..., epoch=)``, the one transition):
- :func:`ensure_not_cancelled` raises :class:`Cancelled` when the job (a
  :class:`~gpufleet.jobrecord.JobRecord`) has ``cancel_requested``;
  every task Lambda calls it first, which is how cancellation reaches every state.
"""

from __future__ import annotations

from gpufleet.errors import Cancelled
from gpufleet.jobrecord import JobRecord


def ensure_not_cancelled(job: JobRecord) -> None:
    if job.cancel_requested:
        raise Cancelled(f"job {job.job_id} was cancelled")
