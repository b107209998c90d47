"""The billing ledger (ledger table): one entry per charged attempt, keyed by (job, epoch), written once.

Contract:
- :func:`record` writes the entry for ``(job_id, epoch)`` in one transaction with a
  condition check that ``epoch`` is the job's current epoch (a fenced-off worker cannot bill)
  and ``attribute_not_exists`` on the entry (a retried Bill task cannot bill twice). The
  job's ``billing`` attribute is set in the same transaction.
- Outcomes: returns ``True`` when the entry was written, ``False`` when it already existed
  (idempotent replay). Raises :class:`~gpufleet.errors.StaleEpoch` when the epoch is not current.
- :func:`record_waiver` sets the job's ``billing`` for a waived attempt and, given the job, writes a
  *waiver* entry (``WAIVER#<epoch>``, ``charged`` false, ``amount_usd`` 0, ``waived_usd`` what the
  attempt's GPU time would have cost at its pool's price), once (``attribute_not_exists``). Waiver
  entries share the tenant index (gsi1) with charges so a cost report reads both in one query;
  :func:`entries` returns only the charges, :func:`waivers` only the waivers.
- :func:`tenant_entries` reads a tenant's charges and waivers from gsi1 between two times (cost reports).
- :class:`LedgerStore` is the Protocol the lifecycle uses; :class:`DynamoLedgerStore` binds these
  functions to a client and the table names. What is charged is decided by the billing policy
  (:mod:`gpufleet.lifecycle.billing`); this module only stores a :class:`Charge`-shaped value.

In-memory fake: :class:`gpufleet.store.fakes.ledger.MemoryLedgerStore`; both are held to one contract suite
(``tests/functional/store/test_store_contract_ledger.py``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import NotFound
from gpufleet.store.dynamo import (
    cancellation_reasons,
    error_code,
    marshal,
    marshal_value,
    paginate,
    reraise,
    translate_errors,
)
from gpufleet.store.fencing import current_item, epoch_condition, fenced_update, job_key, stale
from gpufleet.tables import TableNames, attempt_sk, job_pk, list_sk, tenant_list_pk


class ChargeLike(Protocol):
    """What the ledger stores of a charge (:class:`gpufleet.lifecycle.billing.Charge`)."""

    charged: bool
    gpu_seconds: float
    amount_usd: Decimal

    @property
    def outcome(self) -> Any: ...

    def as_item(self) -> dict[str, Any]: ...


WAIVER_PREFIX = "WAIVER#"


def waiver_sk(epoch: int) -> str:
    return f"{WAIVER_PREFIX}{epoch:08d}"


def entry(job: dict[str, Any], epoch: int, charge: ChargeLike, pool: str | None, price: float,
          at: str) -> dict[str, Any]:
    """The ledger item of a charged attempt (``job``: job_id, tenant, owner_path and, when known, labels)."""
    return {
        "pk": job_pk(job["job_id"]),
        "sk": attempt_sk(epoch),
        "gsi1pk": tenant_list_pk(str(job.get("tenant"))),
        "gsi1sk": list_sk(at, job["job_id"]),
        "job_id": job["job_id"],
        "epoch": epoch,
        "tenant": job.get("tenant"),
        "owner_path": job.get("owner_path"),
        "labels": dict(job.get("labels") or {}),
        "charged": True,
        "outcome": charge.outcome.value,
        "gpu_seconds": charge.gpu_seconds,
        "price_per_gpu_hour": price,
        "amount_usd": str(charge.amount_usd),
        "pool": pool,
        "at": at,
    }


def waiver_entry(job: dict[str, Any], epoch: int, charge: ChargeLike, pool: str | None, price: float,
                 at: str) -> dict[str, Any]:
    """The ledger item of a waived attempt: nothing charged; ``waived_usd`` is its value at ``price``."""
    waived = (Decimal(str(charge.gpu_seconds)) * Decimal(str(price or 0)) / Decimal(3600)).quantize(Decimal("0.000001"))
    return {
        **entry(job, epoch, charge, pool, price, at),
        "sk": waiver_sk(epoch),
        "charged": False,
        "amount_usd": "0",
        "waived_usd": str(waived),
        "waiver": getattr(charge, "waiver", None),
    }


def record(ddb, jobs_table: str, ledger_table: str, job: dict[str, Any], epoch: int, charge: ChargeLike,
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
                        "Key": job_key(job["job_id"]),
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
            reraise(err)
        reasons = cancellation_reasons(err)
        if reasons and reasons[0] == "ConditionalCheckFailed":
            item = current_item(ddb, jobs_table, job["job_id"])
            if item is None:
                raise NotFound(f"job {job['job_id']} not found") from err
            raise stale(job["job_id"], epoch, int(item.get("current_epoch", 0)), "; billing refused") from err
        if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
            return False
        reraise(err)
    return True


def record_waiver(ddb, jobs_table: str, job_id: str, epoch: int, charge: ChargeLike, at: str, *,
                  ledger_table: str | None = None, job: dict[str, Any] | None = None, pool: str | None = None,
                  price: float = 0.0) -> None:
    """Record on the job why an attempt was not charged (fenced on ``epoch`` when ``epoch`` > 0) and, given
    ``job`` and ``ledger_table``, the waiver entry (once)."""
    billing = {**charge.as_item(), "epoch": epoch, "at": at}
    if epoch > 0:
        fenced_update(ddb, jobs_table, job_id, epoch, {"billing": billing})
    else:
        with translate_errors(NotFound, f"job {job_id} not found"):
            ddb.update_item(
                TableName=jobs_table,
                Key=job_key(job_id),
                UpdateExpression="SET billing = :b",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={":b": marshal_value(billing)},
            )
    if job is None or not ledger_table:
        return
    try:
        ddb.put_item(TableName=ledger_table, Item=marshal(waiver_entry(job, epoch, charge, pool, price, at)),
                     ConditionExpression="attribute_not_exists(pk)")
    except ClientError as err:
        if error_code(err) != "ConditionalCheckFailedException":
            reraise(err)


def _job_items(ddb, ledger_table: str, job_id: str, prefix: str) -> list[dict[str, Any]]:
    with translate_errors():
        return list(
            paginate(
                ddb.query,
                TableName=ledger_table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
                ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}, ":p": {"S": prefix}},
                ConsistentRead=True,
            )
        )


def entries(ddb, ledger_table: str, job_id: str) -> list[dict[str, Any]]:
    """The job's charged ledger entries, by epoch."""
    return _job_items(ddb, ledger_table, job_id, "ATTEMPT#")


def waivers(ddb, ledger_table: str, job_id: str) -> list[dict[str, Any]]:
    """The job's waiver entries, by epoch."""
    return _job_items(ddb, ledger_table, job_id, WAIVER_PREFIX)


def tenant_entries(ddb, ledger_table: str, tenant: str, since: str | None = None,
                   until: str | None = None) -> list[dict[str, Any]]:
    """A tenant's charges and waivers recorded in ``[since, until)`` (ISO 8601), oldest first (gsi1)."""
    names = {"#hk": "gsi1pk"}
    values: dict[str, Any] = {":hk": {"S": tenant_list_pk(tenant)}}
    kce = "#hk = :hk"
    if since or until:
        names["#rk"] = "gsi1sk"
    if since and until:
        kce += " AND #rk BETWEEN :lo AND :hi"
        values.update({":lo": {"S": since}, ":hi": {"S": until}})
    elif since:
        kce += " AND #rk >= :lo"
        values[":lo"] = {"S": since}
    elif until:
        kce += " AND #rk <= :hi"
        values[":hi"] = {"S": until}
    with translate_errors():
        return list(paginate(ddb.query, TableName=ledger_table, IndexName="gsi1", KeyConditionExpression=kce,
                             ExpressionAttributeNames=names, ExpressionAttributeValues=values))


class LedgerStore(Protocol):
    """The billing ledger as the lifecycle's Bill step uses it."""

    def record(self, job: dict[str, Any], epoch: int, charge: ChargeLike, *, pool: str | None, price: float,
               at: str) -> bool: ...

    def record_waiver(self, job_id: str, epoch: int, charge: ChargeLike, at: str, *,
                      job: dict[str, Any] | None = None, pool: str | None = None, price: float = 0.0) -> None: ...

    def entries(self, job_id: str) -> list[dict[str, Any]]: ...


class DynamoLedgerStore:
    """:class:`LedgerStore` on the ledger table (fenced on the job item in the jobs table)."""

    def __init__(self, client, tables: TableNames) -> None:
        self.client = client
        self.tables = tables

    def record(self, job, epoch, charge, *, pool, price, at):
        return record(self.client, self.tables.jobs, self.tables.ledger, job, epoch, charge,
                      pool=pool, price=price, at=at)

    def record_waiver(self, job_id, epoch, charge, at, *, job=None, pool=None, price=0.0):
        record_waiver(self.client, self.tables.jobs, job_id, epoch, charge, at, ledger_table=self.tables.ledger,
                      job=job, pool=pool, price=price)

    def entries(self, job_id):
        return entries(self.client, self.tables.ledger, job_id)

    def waivers(self, job_id):
        return waivers(self.client, self.tables.ledger, job_id)
