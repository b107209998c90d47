"""Job helpers shared by the workflow's tasks.

Contract (fenced status changes are ``JobStore.transition(..., epoch=)``, the one transition):
- :func:`ensure_not_cancelled` raises :class:`Cancelled` when the job has ``cancel_requested``;
  every task Lambda calls it first, which is how cancellation reaches every state.
"""

from __future__ import annotations

from typing import Any

from gpufleet.errors import Cancelled


def ensure_not_cancelled(job: dict[str, Any]) -> None:
    if job.get("cancel_requested"):
        raise Cancelled(f"job {job['job_id']} was cancelled")
