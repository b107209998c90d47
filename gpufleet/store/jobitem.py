"""DynamoDB adapter for the worker's writes on its job (every write fenced by epoch).

Contract: :class:`JobItem` is bound to (table, job id, epoch). Each write goes
through :func:`gpufleet.store.fencing.fenced_update` (or a transaction that
includes :func:`gpufleet.store.fencing.epoch_condition`) and raises
:class:`gpufleet.errors.StaleEpoch` when a newer attempt owns the job; the
caller must stop. Attribute shapes are those of docs/contracts.md:
``progress`` {"step", "total"}, ``checkpoint`` {"key", "sha256", "step"},
``generated`` {"key", "sha256"}, ``heartbeat_at``, ``moderation`` and ``output``
(finalize), and on the attempt item
``staging`` {"bytes_moved", "bytes_cached", "seconds", "inputs"}.
:meth:`JobItem.mark_running` moves the job SCHEDULED→RUNNING (with ``running_since``
and a ``status`` event) through the one fenced transition, :func:`gpufleet.store.jobs.transition`
with ``epoch=``, when the workload starts; :meth:`JobItem.add_event` appends a timeline event (e.g. ``resumed``)
in a transaction with the epoch check.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpufleet.clock import Clock, iso
from gpufleet.errors import InvalidTransition, NotFound, StaleEpoch
from gpufleet.status import JobStatus
from gpufleet.store.dynamo import (
    cancellation_reasons,
    error_code,
    marshal,
    translate_errors,
    unmarshal,
    update_expression,
)
from gpufleet.store.fencing import epoch_condition, fenced_update
from gpufleet.store.jobs import build_event, transition
from gpufleet.tables import JOB_META, attempt_sk, job_pk


class JobItem:
    """``return_values``: what each fenced write returns, ``ALL_NEW`` (the item after the write: the
    runtime's own adapter) or ``UPDATED_NEW`` (only what it set: the node API, whose role may not read a
    whole job item; ``mark_running`` then reads nothing back either)."""

    def __init__(self, table: str, job_id: str, epoch: int, client=None, *, clock: Clock,
                 return_values: str = "ALL_NEW") -> None:
        if client is None:
            from gpufleet.store.clients import client as make_client

            client = make_client("dynamodb")
        self.client = client
        self.table = table
        self.job_id = job_id
        self.epoch = epoch
        self.clock = clock
        self.return_values = return_values

    def get(self) -> dict[str, Any]:
        with translate_errors():
            resp = self.client.get_item(TableName=self.table,
                                        Key={"pk": {"S": job_pk(self.job_id)}, "sk": {"S": JOB_META}},
                                        ConsistentRead=True)
        item = unmarshal(resp.get("Item"))
        if item is None:
            raise NotFound(f"job {self.job_id} not found")
        return item

    def get_attempt(self) -> dict[str, Any]:
        """This attempt's item (pk=JOB#id, sk=ATTEMPT#epoch), ``{}`` when there is none."""
        with translate_errors():
            resp = self.client.get_item(TableName=self.table,
                                        Key={"pk": {"S": job_pk(self.job_id)}, "sk": {"S": attempt_sk(self.epoch)}},
                                        ConsistentRead=True)
        return unmarshal(resp.get("Item")) or {}

    def check_current(self) -> dict[str, Any]:
        """Return the job item, raising :class:`StaleEpoch` if this worker's epoch is not current."""
        item = self.get()
        current = int(item.get("current_epoch", 0))
        if current != self.epoch:
            raise StaleEpoch(f"epoch {self.epoch} of {self.job_id} is stale (current {current})",
                             current_epoch=current)
        return item

    def _set(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return fenced_update(self.client, self.table, self.job_id, self.epoch, attrs, return_values=self.return_values)

    def set_progress(self, step: int, total: int) -> dict[str, Any]:
        """Fenced progress + heartbeat write; returns the item (callers read ``cancel_requested``)."""
        return self._set({"progress": {"step": step, "total": total}, "heartbeat_at": iso(self.clock.now())})

    def heartbeat(self) -> dict[str, Any]:
        return self._set({"heartbeat_at": iso(self.clock.now())})

    def mark_running(self) -> bool:
        """SCHEDULED→RUNNING, fenced on this epoch, with ``running_since`` (epoch seconds) and the timeline event.

        Returns True if this call moved the job, False if it was not SCHEDULED (already RUNNING
        from an earlier run of this attempt, or moved on by the workflow). Raises
        :class:`StaleEpoch` when a newer attempt owns the job.
        """
        try:
            transition(self.client, self.table, self.job_id, [JobStatus.SCHEDULED], JobStatus.RUNNING,
                       {"running_since": self.clock.now()}, clock=self.clock, detail={"by": "worker"},
                       epoch=self.epoch, read_back=self.return_values == "ALL_NEW")
        except InvalidTransition:
            return False
        return True

    def set_checkpoint(self, key: str, sha256: str, step: int) -> None:
        self._set({"checkpoint": {"key": key, "sha256": sha256, "step": step}})

    def set_generated(self, ref: dict[str, Any]) -> None:
        self._set({"generated": ref})

    def set_finalized(self, moderation: dict[str, Any], output: dict[str, Any] | None) -> None:
        """The finalize stage's verdict: ``moderation`` always, ``output`` only when not blocked."""
        attrs: dict[str, Any] = {"moderation": moderation}
        if output is not None:
            attrs["output"] = output
        # nothing is read back: the stage's last write needs no item (a whole job item's answer to parse)
        fenced_update(self.client, self.table, self.job_id, self.epoch, attrs, return_values="NONE")

    def add_event(self, kind: str, detail: dict[str, Any]) -> None:
        """Append a timeline event (``kind``, ``detail`` + this epoch), fenced on the job's epoch."""
        event = build_event(self.job_id, kind, self.clock.now(), {**detail, "epoch": self.epoch})
        self._fenced_write({"Put": {"TableName": self.table, "Item": marshal(event),
                                    "ConditionExpression": "attribute_not_exists(pk)"}})

    def record_attempt(self, attrs: dict[str, Any]) -> None:
        """Set ``attrs`` on this attempt's item (pk=JOB#id, sk=ATTEMPT#epoch), fenced on the job's epoch."""
        expr, anames, avalues = update_expression(attrs, tag="a")
        self._fenced_write({"Update": {"TableName": self.table,
                                       "Key": {"pk": {"S": job_pk(self.job_id)}, "sk": {"S": attempt_sk(self.epoch)}},
                                       "UpdateExpression": expr,
                                       "ExpressionAttributeNames": anames, "ExpressionAttributeValues": avalues}})

    def _fenced_write(self, item: dict[str, Any]) -> None:
        """One transaction: the job's epoch check, then ``item``; :class:`StaleEpoch` when the check fails."""
        cond, names, values = epoch_condition(self.epoch)
        try:
            self.client.transact_write_items(TransactItems=[
                {"ConditionCheck": {"TableName": self.table,
                                    "Key": {"pk": {"S": job_pk(self.job_id)}, "sk": {"S": JOB_META}},
                                    "ConditionExpression": cond, "ExpressionAttributeNames": names,
                                    "ExpressionAttributeValues": values}},
                item,
            ])
        except ClientError as err:
            if error_code(err) == "TransactionCanceledException" and cancellation_reasons(err)[:1] == [
                "ConditionalCheckFailed"
            ]:
                raise StaleEpoch(f"epoch {self.epoch} of {self.job_id} is stale") from err
            with translate_errors():
                raise
