"""In-memory :class:`~gpufleet.store.jobs.JobStore`: the job item, its attempts and its timeline.

Items are built by the same pure builders as the DynamoDB store (:func:`~gpufleet.store.jobs.build_job`,
:func:`~gpufleet.store.jobs.build_event`) and stored after the same marshalling round trip, so numbers,
``None`` and nested values read back exactly as they do from DynamoDB. Conditions are checked and
applied under the database lock (a DynamoDB conditional write is atomic too).
"""

from __future__ import annotations

import copy
import decimal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet.clock import Clock, iso
from gpufleet.errors import BadRequest, Cancelled, Conflict, InvalidTransition, NotFound, ValidationFailed
from gpufleet.ids import new_job_id
from gpufleet.jobrecord import JobRecord
from gpufleet.status import ACTIVE_QUEUE, JobStatus, check_reopen, check_transition
from gpufleet.store import cursor as cursor_codec
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.fakes.memory import MemoryDatabase, MemoryWrite
from gpufleet.store.fencing import stale
from gpufleet.store.guard import Guard
from gpufleet.store.jobs import MAX_EVENTS, MAX_LIST_LIMIT, build_event, build_job, iso_bound, item_filter, public
from gpufleet.tables import JOB_META, active_pk, attempt_sk, job_pk, pending_partition, tenant_list_pk, user_list_pk

if TYPE_CHECKING:
    from gpufleet.safety.profile import FrozenSafety


def stored(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` as DynamoDB would give it back (floats → numbers, ``None`` attributes dropped)."""
    return unmarshal(marshal(item)) or {}


@dataclass
class MemoryJobStore:
    db: MemoryDatabase
    clock: Clock
    table: str = "jobs"

    # ------------------------------------------------------------ reads

    def _item(self, job_id: str) -> dict[str, Any] | None:
        return self.db.get(self.table, (job_pk(job_id), JOB_META))

    def get(self, job_id: str, tenant: str | None = None, *, consistent: bool = True) -> dict[str, Any]:
        item = self._item(job_id)
        if item is None or (tenant is not None and item.get("tenant") != tenant):
            raise NotFound(f"job {job_id} not found")
        return item

    def get_record(self, job_id: str, tenant: str | None = None) -> JobRecord:
        return JobRecord.from_item(self.get(job_id, tenant))

    def get_attempt(self, job_id: str, epoch: int) -> dict[str, Any] | None:
        return self.db.get(self.table, (job_pk(job_id), attempt_sk(epoch)))

    def events(self, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
        self.get(job_id, tenant)
        rows = self._children(job_id, "EVENT#")[:MAX_EVENTS]
        return [{"ts": it["ts"], "type": it["kind"], "detail": it.get("detail") or {}} for it in rows]

    def deliveries(self, job_id: str, tenant: str | None = None) -> list[dict[str, Any]]:
        self.get(job_id, tenant)
        return [{k: v for k, v in it.items() if k not in ("pk", "sk")} for it in self._children(job_id, "DELIVERY#")]

    def _children(self, job_id: str, prefix: str) -> list[dict[str, Any]]:
        with self.db.lock:
            rows = [it for (pk, sk), it in self.db.table(self.table).items() if pk == job_pk(job_id) and sk.startswith(prefix)]
            return copy.deepcopy(sorted(rows, key=lambda it: it["sk"]))

    def list(
        self, *, tenant: str, secret: bytes, user: str | None = None, statuses: Sequence[JobStatus | str] | None = None,
        created_after: datetime | float | str | None = None, created_before: datetime | float | str | None = None,
        limit: int = 20, cursor: str | None = None, array_id: str | None = None, labels: dict[str, str] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be 1..{MAX_LIST_LIMIT}")
        status_values = sorted({JobStatus(s).value for s in statuses or ()})
        lo, hi = iso_bound(created_after), iso_bound(created_before)
        keep = item_filter(status_values, array_id, labels)
        hk, rk, pk_value = ("gsi1pk", "gsi1sk", tenant_list_pk(tenant)) if user is None else (
            "gsi2pk", "gsi2sk", user_list_pk(tenant, user))
        scope = {"t": tenant, "u": user, "s": status_values, "a": lo, "b": hi,
                 **({"r": array_id} if array_id else {}), **({"l": sorted((labels or {}).items())} if labels else {})}
        after = None
        if cursor:
            pos = cursor_codec.decode(cursor, scope, secret)
            try:
                after = (pos["rk"], pos["pk"])
            except (KeyError, TypeError) as err:
                raise BadRequest("cursor is not valid", param="cursor") from err
        with self.db.lock:
            rows = [it for it in self.db.table(self.table).values() if it.get(hk) == pk_value]
        rows.sort(key=lambda it: (it[rk], it["pk"]), reverse=True)  # the index's order, newest first
        rows = [it for it in rows if (lo is None or it[rk] >= lo) and (hi is None or it[rk] <= hi)
                and (after is None or (it[rk], it["pk"]) < after)]
        out: list[dict[str, Any]] = []
        for idx, it in enumerate(rows):
            if not keep(it):
                continue
            out.append(public(copy.deepcopy(it)))
            if len(out) >= limit:
                more = idx < len(rows) - 1
                return out, (cursor_codec.encode({"hk": it[hk], "rk": it[rk], "pk": it["pk"]}, scope, secret)
                             if more else None)
        return out, None

    def count_active(
        self, tenant: str, team: str, user: str, *, cap_user: int | None = None, cap_team: int | None = None
    ) -> tuple[int, int]:
        part = active_pk(tenant, team)
        with self.db.lock:
            keys = [it.get("gsi4sk", "") for it in self.db.table(self.table).values() if it.get("gsi4pk") == part]
        user_n = sum(1 for k in keys if k.startswith(f"{user}#"))
        team_n = len(keys)
        return (user_n if cap_user is None else min(user_n, cap_user)), (team_n if cap_team is None else min(team_n, cap_team))

    # ------------------------------------------------------------ writes

    def _put_event(self, job_id: str, kind: str, now: float, detail: dict[str, Any] | None) -> dict[str, Any]:
        event = build_event(job_id, kind, now, detail)
        self.db.put(self.table, stored(event))
        return event

    def create(
        self, *, tenant: str, team: str, user: str, spec: dict[str, Any], job_id: str | None = None,
        extra_items: Sequence[MemoryWrite] | Callable[[dict[str, Any]], Sequence[MemoryWrite]] = (),
        attrs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        job_id = job_id or new_job_id(int(self.clock.now() * 1000))

        def extras(items: list[dict[str, Any]]) -> Sequence[MemoryWrite]:
            return list(extra_items(items[0]) if callable(extra_items) else extra_items)

        return self.create_many(tenant=tenant, team=team, user=user, jobs=[(job_id, spec, attrs or {})],
                                extra_items=extras)[0]

    def create_many(
        self, *, tenant: str, team: str, user: str, jobs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
        extra_items: Any = (),
    ) -> list[dict[str, Any]]:
        now = self.clock.now()
        items = [{**build_job(job_id, tenant, team, user, spec, now), **attrs} for job_id, spec, attrs in jobs]
        extras = list(extra_items(items) if callable(extra_items) else extra_items)
        try:
            rows = [stored(item) for item in items]
        except decimal.DecimalException as err:
            raise ValidationFailed(
                "a number in the spec is outside what can be stored (magnitude 1e-130 to 1e125, 38 digits)"
            ) from err

        def one(row: dict[str, Any], attrs: dict[str, Any]) -> MemoryWrite:
            job_id = row["job_id"]

            def write() -> None:
                self.db.put(self.table, row)
                self._put_event(job_id, "created", now, {"status": JobStatus.QUEUED.value, **attrs})

            return MemoryWrite(check=lambda: self._item(job_id) is None, apply=write,
                               error=lambda: Conflict(f"job {job_id} already exists"))

        self.db.transact([*(one(r, j[2]) for r, j in zip(rows, jobs, strict=True)), *extras])
        return items

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return self._children(job_id, "ATTEMPT#")

    def transition(
        self, job_id: str, from_statuses: Iterable[JobStatus | str], to_status: JobStatus | str,
        extra: dict[str, Any] | None = None, *, detail: dict[str, Any] | None = None, remove: Sequence[str] = (),
        epoch: int | None = None, guard: Guard | None = None, operator: bool = False,
    ) -> dict[str, Any]:
        now = self.clock.now()
        froms = [JobStatus(s) for s in from_statuses]
        to = JobStatus(to_status)
        if not froms:
            raise ValueError("from_statuses must not be empty")
        for f in froms:
            (check_reopen if operator else check_transition)(f, to)
        with self.db.lock:
            item = self.get(job_id)
            current = int(item.get("current_epoch", 0))
            if epoch is not None and current != epoch:
                raise stale(job_id, epoch, current)
            if item.get("status") not in {f.value for f in froms} or (guard is not None and not guard.holds(item)):
                raise InvalidTransition(
                    f"cannot move job {job_id} from {item.get('status')} to {to.value}", current_status=item.get("status")
                )
            item.update(status=to.value, updated_at=iso(now))
            index = {"gsi3pk": pending_partition(job_id), "gsi3sk": item.get("pending_sort")} if to is JobStatus.PENDING else {}
            if to in ACTIVE_QUEUE:
                index.update(gsi4pk=item.get("active_part"), gsi4sk=item.get("active_sort"))
            for attr in ("gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk", *remove):
                item.pop(attr, None)
            item.update(index)
            item.update(extra or {})
            self.db.put(self.table, stored(item))
            fence = {"epoch": epoch} if epoch is not None else {}
            self._put_event(job_id, "status", now, {"to": to.value, "from": [f.value for f in froms], **fence, **(detail or {})})
        return self.get(job_id)

    def append_event(self, job_id: str, kind: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        event = self._put_event(job_id, kind, self.clock.now(), detail)
        return {"ts": event["ts"], "type": kind, "detail": event["detail"]}

    def request_cancel(self, job_id: str, tenant: str | None = None, *, requested_by: str | None = None) -> dict[str, Any]:
        with self.db.lock:
            item = self.get(job_id, tenant)
            if item.get("cancel_requested"):
                return item
            status = JobStatus(item["status"])
            if status.is_terminal():
                raise InvalidTransition(f"job {job_id} is already {status.value}", current_status=status.value)
            now = iso(self.clock.now())
            item.update(cancel_requested=True, cancel_requested_at=now, updated_at=now)
            self.db.put(self.table, item)
            self._put_event(job_id, "cancel_requested", self.clock.now(), {"status": status.value, "by": requested_by})
        return self.get(job_id)

    def fenced_update(self, job_id: str, epoch: int, set_attrs: dict[str, Any], *, guard: Guard | None = None) -> dict[str, Any]:
        with self.db.lock:
            item = self._item(job_id)
            if item is None:
                raise NotFound(f"job {job_id} not found")
            if int(item.get("current_epoch", 0)) != epoch:
                raise stale(job_id, epoch, int(item.get("current_epoch", 0)))
            if guard is not None and not guard.holds(item):
                raise Conflict(f"condition failed for {job_id}")
            item.update(set_attrs)
            self.db.put(self.table, stored(item))
            return self.get(job_id)

    def issue_epoch(self, job_id: str, observed_epoch: int, extra: dict[str, Any] | None = None) -> int:
        with self.db.lock:
            item = self._item(job_id)
            if item is None or int(item.get("current_epoch", 0)) != observed_epoch:
                raise Conflict(f"epoch of {job_id} is no longer {observed_epoch}")
            item.update(extra or {}, current_epoch=observed_epoch + 1)
            self.db.put(self.table, stored(item))
            return observed_epoch + 1

    def freeze_safety(self, job_id: str, safety: FrozenSafety) -> FrozenSafety:
        from gpufleet.safety.profile import FrozenSafety  # heavy package: only CheckPrompt needs it

        with self.db.lock:
            item = self._item(job_id)
            if item is None:
                raise NotFound(f"job {job_id} not found")
            if item.get("cancel_requested"):
                raise Cancelled(f"job {job_id} was cancelled")
            if item.get("safety"):
                return FrozenSafety.model_validate(item["safety"])
            item["safety"] = safety.as_item()
            self.db.put(self.table, stored(item))
            return safety
