"""Job writes of the workflow's tasks (I/O), built on :mod:`gpufleet.store.jobs` and fencing.

Contract:
- :func:`fenced_transition` is :func:`gpufleet.store.jobs.transition` with the fencing
  condition ANDed in: the status change (and its event) lands only if the job's
  ``current_epoch`` is ``epoch``. Raises :class:`StaleEpoch` when the epoch is not current,
  :class:`InvalidTransition` when only the status condition failed.
- :func:`ensure_not_cancelled` raises :class:`Cancelled` when the job has ``cancel_requested``;
  every task Lambda calls it first, which is how cancellation reaches every state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, SystemClock
from gpufleet.errors import Cancelled, InvalidTransition, StaleEpoch
from gpufleet.status import JobStatus
from gpufleet.store import jobs
from gpufleet.store.dynamo import error_code, marshal
from gpufleet.store.fencing import epoch_condition


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
    clock: Clock | None = None,
    detail: dict[str, Any] | None = None,
    remove: Sequence[str] = (),
) -> dict[str, Any]:
    """Status change conditioned on ``current_epoch == epoch``; returns the job after the write."""
    now = (clock or SystemClock()).now()
    froms = [JobStatus(s) for s in from_statuses]
    to = JobStatus(to_status)
    upd = jobs.transition_update(table, job_id, froms, to, now, extra, remove)
    cond, names, values = epoch_condition(epoch)
    body = upd["Update"]
    body["ConditionExpression"] = f"({body['ConditionExpression']}) AND ({cond})"
    body["ExpressionAttributeNames"].update(names)
    body["ExpressionAttributeValues"].update(values)
    event = jobs.build_event(
        job_id, "status", now, {"to": to.value, "from": [f.value for f in froms], "epoch": epoch, **(detail or {})}
    )
    put = {"Put": {"TableName": table, "Item": marshal(event), "ConditionExpression": "attribute_not_exists(pk)"}}
    try:
        client.transact_write_items(TransactItems=[upd, put])
    except ClientError as err:
        if error_code(err) != "TransactionCanceledException":
            raise
        job = jobs.get_job(client, table, job_id)
        current = int(job.get("current_epoch", 0))
        if current != epoch:
            raise StaleEpoch(
                f"epoch {epoch} of {job_id} is stale (current {current})", current_epoch=current
            ) from err
        raise InvalidTransition(
            f"cannot move job {job_id} from {job.get('status')} to {to.value}", current_status=job.get("status")
        ) from err
    return jobs.get_job(client, table, job_id)
