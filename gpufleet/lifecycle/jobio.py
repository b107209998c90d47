"""Job helpers shared by the workflow's tasks and the worker runtime.

Contract:
- :func:`fenced_transition` is :func:`gpufleet.store.jobs.transition` with ``epoch=``: the
  status change (and its event) lands only if the job's ``current_epoch`` is ``epoch``.
  Raises :class:`StaleEpoch` when the epoch is not current, :class:`InvalidTransition` when
  only the status condition failed. (The lifecycle steps call ``JobStore.transition(epoch=)``.)
- :func:`ensure_not_cancelled` raises :class:`Cancelled` when the job has ``cancel_requested``;
  every task Lambda calls it first, which is how cancellation reaches every state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpufleet.clock import Clock
from gpufleet.errors import Cancelled
from gpufleet.status import JobStatus
from gpufleet.store import jobs


def ensure_not_cancelled(job: dict[str, Any]) -> None:
    if job.get("cancel_requested"):
        raise Cancelled(f"job {job['job_id']} was cancelled")


def fenced_transition(
    client,
    table: str,
    job_id: str,
    epoch: int,
    from_statuses: Iterable[JobStatus | str],
    to_status: JobStatus | str,
    extra: dict[str, Any] | None = None,
    *,
    clock: Clock,
    detail: dict[str, Any] | None = None,
    remove: Sequence[str] = (),
) -> dict[str, Any]:
    """Status change conditioned on ``current_epoch == epoch``; returns the job after the write."""
    return jobs.transition(
        client, table, job_id, from_statuses, to_status, extra,
        clock=clock, detail=detail, remove=remove, epoch=epoch,
    )
