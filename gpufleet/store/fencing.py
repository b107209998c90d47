"""Fencing epochs: the effectively-once guarantee, enforced in conditional writes.

Contract:
- The job item (pk=JOB#id, sk=META in the jobs table) carries ``current_epoch``.
- :func:`issue_epoch` raises it by one with a conditional write on the value the
  caller observed; two racing issuers cannot both win. The new epoch is returned.
- Every worker write goes through :func:`fenced_update` (or includes
  :func:`epoch_condition` in a transaction). It lands only if
  ``current_epoch == epoch``; otherwise :class:`gpufleet.errors.StaleEpoch` is
  raised and the worker must stop. The epoch is passed explicitly, never via globals.
- A fenced *status change* is :func:`gpufleet.store.jobs.transition` with ``epoch=``;
  it builds its condition with :func:`epoch_condition` too.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpufleet.errors import Conflict, NotFound, StaleEpoch
from gpufleet.store.dynamo import error_code, marshal_values, reraise, set_clause, unmarshal
from gpufleet.store.guard import Guard
from gpufleet.tables import JOB_META, job_pk

#: What a fenced write (:func:`fenced_update`, :func:`issue_epoch`, :func:`epoch_condition`) names besides what it
#: sets: the job item's key and its epoch.
FENCE_ATTRIBUTES = ("pk", "sk", "current_epoch")


def job_key(job_id: str) -> dict[str, Any]:
    """The marshalled key of the job item."""
    return {"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}}


def epoch_condition(epoch: int, *, missing_is_zero: bool = False) -> tuple[str, dict[str, str], dict[str, Any]]:
    """Condition expression parts asserting the job's current epoch is ``epoch``.

    ``missing_is_zero``: epoch ``0`` also matches a job item without ``current_epoch``.
    """
    cond = "#ce = :fence_epoch"
    if missing_is_zero and epoch == 0:
        cond = "(attribute_not_exists(#ce) OR #ce = :fence_epoch)"
    return cond, {"#ce": "current_epoch"}, {":fence_epoch": {"N": str(epoch)}}


def stale(job_id: str, epoch: int, current: int, what: str = "") -> StaleEpoch:
    """The :class:`StaleEpoch` of a write fenced on ``epoch`` while the job is at ``current``."""
    return StaleEpoch(f"epoch {epoch} of {job_id} is stale (current {current}){what}", current_epoch=current)


def _update_job(client, table: str, job_id: str, sets: list[str], cond: str, names: dict[str, str],
                values: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """One conditional ``UpdateItem`` of the job item (``SET`` ``sets`` if ``cond``)."""
    return client.update_item(TableName=table, Key=job_key(job_id), UpdateExpression="SET " + ", ".join(sets),
                              ConditionExpression=cond, ExpressionAttributeNames=names,
                              ExpressionAttributeValues=values, **kwargs)


def issue_epoch(client, table: str, job_id: str, observed_epoch: int, extra: dict[str, Any] | None = None) -> int:
    """Atomically move the job from ``observed_epoch`` to ``observed_epoch + 1``.

    ``extra`` attributes are set in the same write. Raises :class:`Conflict` if
    another issuer got there first (or the job is gone).
    """
    new = observed_epoch + 1
    names = {"#ce": "current_epoch"}
    values: dict[str, Any] = {":new": {"N": str(new)}, ":old": {"N": str(observed_epoch)}}
    sets = ["#ce = :new", *set_clause(extra or {}, names, values)]
    if observed_epoch == 0:
        cond = "attribute_exists(pk) AND (attribute_not_exists(#ce) OR #ce = :old)"
    else:
        cond = "#ce = :old"
    try:
        _update_job(client, table, job_id, sets, cond, names, values)
    except ClientError as err:
        if error_code(err) == "ConditionalCheckFailedException":
            raise Conflict(f"epoch of {job_id} is no longer {observed_epoch}") from err
        reraise(err)
    return new


def fenced_update(
    client,
    table: str,
    job_id: str,
    epoch: int,
    set_attrs: dict[str, Any],
    *,
    guard: Guard | None = None,
    return_values: str = "ALL_NEW",
) -> dict[str, Any]:
    """Set ``set_attrs`` on the job item only if ``current_epoch == epoch``.

    ``guard`` (a :class:`~gpufleet.store.guard.Guard`) is ANDed in. Returns the item after the write. Raises
    :class:`StaleEpoch` when the epoch is not current, :class:`NotFound` when
    the job does not exist, and :class:`Conflict` when only the guard failed.
    """
    cond, names, values = epoch_condition(epoch)
    sets = set_clause(set_attrs, names, values, "s")
    extra, guard_names, guard_values = guard.expression() if guard is not None else (None, {}, {})
    if extra:
        cond = f"({cond}) AND ({extra})"
        names.update(guard_names)
        values.update(marshal_values(guard_values))
    try:
        resp = _update_job(client, table, job_id, sets, cond, names, values, ReturnValues=return_values,
                           ReturnValuesOnConditionCheckFailure="ALL_OLD")
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            reraise(err)
        old = unmarshal(err.response.get("Item"))
        if old is None:
            old = current_item(client, table, job_id, fields=("current_epoch",))
        if old is None:
            raise NotFound(f"job {job_id} not found") from err
        if int(old.get("current_epoch", 0)) != epoch:
            raise stale(job_id, epoch, int(old.get("current_epoch", 0))) from err
        raise Conflict(f"condition failed for {job_id}") from err
    return unmarshal(resp.get("Attributes")) or {}


def current_item(client, table: str, job_id: str, *, fields: tuple[str, ...] | None = None) -> dict[str, Any] | None:
    """The job item read consistently (only ``pk`` and ``fields`` when given), or ``None``."""
    kw: dict[str, Any] = {}
    if fields is not None:
        names = ("pk", *fields)
        kw = {"ProjectionExpression": ", ".join(f"#f{i}" for i in range(len(names))),
              "ExpressionAttributeNames": {f"#f{i}": n for i, n in enumerate(names)}}
    try:
        got = client.get_item(TableName=table, Key=job_key(job_id), ConsistentRead=True, **kw)
    except ClientError as err:
        reraise(err)
    return unmarshal(got.get("Item"))
