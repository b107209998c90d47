"""The billing ledger (I/O): one entry per charged attempt, keyed by (job, epoch), written once.

Contract:
- :func:`record` writes the entry for ``(job_id, epoch)`` in one transaction with a
  condition check that ``epoch`` is the job's current epoch (a fenced-off worker cannot bill)
  and ``attribute_not_exists`` on the entry (a retried Bill task cannot bill twice). The
  job's ``billing`` attribute is set in the same transaction.
- Outcomes: returns ``True`` when the entry was written, ``False`` when it already existed
  (idempotent replay). Raises :class:`~gpufleet.errors.StaleEpoch` when the epoch is not current.
- :func:`record_waiver` sets only the job's ``billing`` (no ledger entry) for a waived attempt.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpufleet.errors import NotFound, StaleEpoch
from gpufleet.lifecycle.billing import Charge
from gpufleet.store.dynamo import cancellation_reasons, error_code, marshal, marshal_value, unmarshal
from gpufleet.store.fencing import epoch_condition, fenced_update
from gpufleet.tables import JOB_META, attempt_sk, job_pk


def entry(job: dict[str, Any], epoch: int, charge: Charge, pool: str | None, price: float, at: str) -> dict[str, Any]:
    return {
        "pk": job_pk(job["job_id"]),
        "sk": attempt_sk(epoch),
        "gsi1pk": f"TENANT#{job.get('tenant')}",
        "gsi1sk": f"{at}#{job['job_id']}",
        "job_id": job["job_id"],
        "epoch": epoch,
        "tenant": job.get("tenant"),
        "owner_path": job.get("owner_path"),
        "outcome": charge.outcome.value,
        "gpu_seconds": charge.gpu_seconds,
        "price_per_gpu_hour": price,
        "amount_usd": str(charge.amount_usd),
        "pool": pool,
        "at": at,
    }


def record(ddb, jobs_table: str, ledger_table: str, job: dict[str, Any], epoch: int, charge: Charge,
           *, pool: str | None, price: float, at: str) -> bool:
    """Write the ledger entry of a charged attempt (fenced, once). See module contract."""
    if not charge.charged:
        raise ValueError("record() is for charged attempts; use record_waiver()")
    cond, names, values = epoch_condition(epoch)
    billing = {**charge.as_item(), "epoch": epoch, "at": at}
    try:
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": jobs_table,
                        "Key": {"pk": {"S": job_pk(job["job_id"])}, "sk": {"S": JOB_META}},
                        "UpdateExpression": "SET #b = :b",
                        "ConditionExpression": cond,
                        "ExpressionAttributeNames": {**names, "#b": "billing"},
                        "ExpressionAttributeValues": {**values, ":b": marshal_value(billing)},
                    }
                },
                {
                    "Put": {
                        "TableName": ledger_table,
                        "Item": marshal(entry(job, epoch, charge, pool, price, at)),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    except ClientError as err:
        if error_code(err) != "TransactionCanceledException":
            raise
        reasons = cancellation_reasons(err)
        if reasons and reasons[0] == "ConditionalCheckFailed":
            current = _current_epoch(ddb, jobs_table, job["job_id"])
            raise StaleEpoch(
                f"epoch {epoch} of {job['job_id']} is stale (current {current}); billing refused",
                current_epoch=current,
            ) from err
        if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
            return False
        raise
    return True


def record_waiver(ddb, jobs_table: str, job_id: str, epoch: int, charge: Charge, at: str) -> None:
    """Record on the job why an attempt was not charged (fenced on ``epoch`` when ``epoch`` > 0)."""
    billing = {**charge.as_item(), "epoch": epoch, "at": at}
    if epoch > 0:
        fenced_update(ddb, jobs_table, job_id, epoch, {"billing": billing})
        return
    ddb.update_item(
        TableName=jobs_table,
        Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
        UpdateExpression="SET billing = :b",
        ConditionExpression="attribute_exists(pk)",
        ExpressionAttributeValues={":b": marshal_value(billing)},
    )


def entries(ddb, ledger_table: str, job_id: str) -> list[dict[str, Any]]:
    resp = ddb.query(
        TableName=ledger_table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}},
        ConsistentRead=True,
    )
    return [unmarshal(i) for i in resp.get("Items", [])]


def _current_epoch(ddb, table: str, job_id: str) -> int:
    item = unmarshal(
        ddb.get_item(
            TableName=table, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}}, ConsistentRead=True
        ).get("Item")
    )
    if item is None:
        raise NotFound(f"job {job_id} not found")
    return int(item.get("current_epoch", 0))
