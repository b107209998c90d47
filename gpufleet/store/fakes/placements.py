"""In-memory :class:`~gpufleet.store.placements.PlacementStore`: the placement transaction, release and the
pass's other writes, with the DynamoDB store's conditions and outcomes.

A placement's items (attempt, status event, allocation records) and its counter deltas come from the DynamoDB
store's own builder (``placements._parts``); the job move, the new items and every counter land together
under the database lock or not at all, as the ``TransactWriteItems`` does: the job must still be PENDING at
the epoch the snapshot saw, every GPU booking stay <= 1000 milli, a cloud pool's usage <= ``max_gpus``, and
every quota level's usage within its limit. A lost race is a :class:`CommitResult` with ``ok=False`` and a
``lost: ...`` reason; a group that loses falls back to one placement at a time. There is no workflow here:
placement tokens are not completed and :meth:`MemoryPlacementStore.expire` answers False (as
:class:`~gpufleet.store.placements.DynamoPlacementStore` without a Step Functions client).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.clock import Clock, iso
from gpufleet.errors import Conflict, NotFound, TransientError
from gpufleet.pools import Pool
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import ALL_TYPES, Allocation, QuotaNode, ancestors
from gpufleet.scheduler.nodetable import MILLI
from gpufleet.status import ACTIVE_QUEUE, JobStatus
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.escrow import Amounts, amounts_from_item, escrow_attr, limit_of
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import Key, MemoryDatabase
from gpufleet.store.placements import (
    MAX_TRANSACTION_ITEMS,
    PLACEMENT_RESETS,
    CommitResult,
    _Parts,
    _parts,
    _shared_items,
    _totals,
    commit_groups,
    shared_counters,
)
from gpufleet.store.quotas import usage_attr, usage_from_item
from gpufleet.tables import (
    BOOK_SK,
    DIRECTORY_ATTR,
    ESCROW_SK,
    JOB_META,
    POOL_SK,
    QUOTA_SK,
    TableNames,
    alloc_pk,
    alloc_sk,
    attempt_sk,
    directory_of,
    escrow_pk,
    job_pk,
    quota_pk,
)

#: the fake's table names: the logical names, as the other fakes use them
NAMES = TableNames(jobs="jobs", control="control", ledger="ledger")


@dataclass
class MemoryPlacementStore:
    db: MemoryDatabase
    names: TableNames = field(default_factory=lambda: NAMES)

    # ------------------------------------------------------------ the placement transaction

    def _add(self, table: str, key: Key, deltas: dict[str, int]) -> None:
        """ADD ``deltas`` to counters of an item (created when missing; directory attribute set as ``_upd`` does)."""
        item = self.db.get(table, key) or {"pk": key[0], "sk": key[1]}
        listed = directory_of(*key)
        if listed is not None:
            item[DIRECTORY_ATTR] = listed
        for attr, n in deltas.items():
            item[attr] = int(item.get(attr, 0)) + n
        self.db.put(table, item)

    def _try(self, batch: list[_Parts], quotas: dict[str, QuotaNode], pools: dict[str, Pool],
             lane: str | None = None) -> str | None:
        """One transaction over ``batch``: None when it landed, else why not (nothing written). With a ``lane``,
        quota is drawn from the lane's escrow item (each counter must hold the group's total) instead."""
        try:
            _shared_items(self.names, batch, quotas, pools, lane)  # the same up-front refusals (over-booked, too big)
        except Conflict as err:
            return str(err)
        jobs, control = self.names.jobs, self.names.control
        totals = _totals(batch)
        books, pool_use, quota = totals.books, totals.pool_use, totals.quota
        with self.db.lock:
            failed: list[str] = []
            for pt in batch:
                job = pt.placement.job
                item = self.db.get(jobs, (job_pk(job.job_id), JOB_META))
                epoch_ok = item is not None and (int(item["current_epoch"]) == job.observed_epoch if "current_epoch" in item
                                                 else job.observed_epoch == 0)
                if item is None or item.get("status") != JobStatus.PENDING.value or not epoch_ok:
                    failed.append(f"job {job.job_id}")
                for put in pt.own[1:]:
                    new = unmarshal(put["Put"]["Item"]) or {}
                    table = jobs if put["Put"]["TableName"] == jobs else control
                    if self.db.get(table, (new["pk"], new["sk"])) is not None:
                        failed.append(f"{new['pk']}/{new['sk']} exists")
            for node, gs in books.items():
                book = self.db.get(control, (alloc_pk(node), BOOK_SK)) or {}
                failed += [f"{node} g{g}" for g, m in gs.items() if f"g{g}" in book and int(book[f"g{g}"]) > MILLI - m]
            for pool, m in pool_use.items():
                used = (self.db.get(control, (alloc_pk(pool), POOL_SK)) or {}).get("used_milli")
                if used is not None and int(used) > pools[pool].max_gpus * MILLI - m:
                    failed.append(f"pool {pool}")
            escrow = (self.db.get(control, (escrow_pk(lane), ESCROW_SK)) or {}) if lane is not None else {}
            for path, per_type in quota.items():
                q, row = quotas.get(path), self.db.get(control, (quota_pk(path), QUOTA_SK)) or {}
                for t, m in per_type.items():
                    if lane is not None:
                        if int(escrow.get(escrow_attr(path, t), 0)) < m:
                            failed.append(f"escrow {lane} {path} {t}")
                        continue
                    lim = q.limit(t) if q is not None else None
                    if lim is not None and usage_attr(t) in row and int(row[usage_attr(t)]) > lim - m:
                        failed.append(f"quota {path} {t}")
            if failed:
                return f"lost: {failed}"
            for pt in batch:
                self._apply_own(pt)
            for node, gs in books.items():
                self._add(control, (alloc_pk(node), BOOK_SK), {f"g{g}": m for g, m in gs.items()})
            for pool, m in pool_use.items():
                self._add(control, (alloc_pk(pool), POOL_SK), {"used_milli": m})
            if lane is not None:
                if quota:
                    self._add(control, (escrow_pk(lane), ESCROW_SK),
                              {escrow_attr(path, t): -m for path, per_type in quota.items() for t, m in per_type.items()})
                return None
            for path, per_type in quota.items():
                self._add(control, (quota_pk(path), QUOTA_SK), {usage_attr(t): m for t, m in per_type.items()})
        return None

    def _apply_own(self, pt: _Parts) -> None:
        job = pt.placement.job
        jobs = self.names.jobs
        item = self.db.get(jobs, (job_pk(job.job_id), JOB_META)) or {}
        extra = {"current_epoch": pt.epoch, "placement": pt.doc, "attempt_count": job.attempts + 1}
        upd = pt.own[0]["Update"]
        now_iso = unmarshal({"v": upd["ExpressionAttributeValues"][":now"]})["v"]  # the move's own time stamp
        item.update(status=JobStatus.SCHEDULED.value, updated_at=now_iso, scheduled_at=now_iso, **extra)
        for attr in ("gsi3pk", "gsi3sk", "gsi4pk", "gsi4sk", *PLACEMENT_RESETS):
            item.pop(attr, None)
        if JobStatus.SCHEDULED in ACTIVE_QUEUE and item.get("active_part") is not None:
            item.update(gsi4pk=item.get("active_part"), gsi4sk=item.get("active_sort"))
        self.db.put(jobs, stored(item))
        for put in pt.own[1:]:
            new = unmarshal(put["Put"]["Item"]) or {}
            self.db.put(jobs if put["Put"]["TableName"] == jobs else self.names.control, new)

    def _commit_one(self, p: Placement, quotas: dict[str, QuotaNode], now: float, lane: str | None = None) -> CommitResult:
        pt = _parts(self.names, p, now)
        reason = self._try([pt], quotas, {p.pool.name: p.pool}, lane)
        return CommitResult(p.job.job_id, reason is None, pt.epoch if reason is None else 0, reason=reason or "")

    def commit_many(self, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *,
                    group: int = 20, lane: str | None = None) -> list[CommitResult]:
        results: list[CommitResult] = []
        pools = {p.pool.name: p.pool for p in placements}

        def flush(batch: list[_Parts]) -> None:
            if not batch:
                return
            size = sum(len(pt.own) for pt in batch) + len(shared_counters(batch, lane))
            reason = self._try(batch, quotas, pools, lane) if size <= MAX_TRANSACTION_ITEMS else "too large"
            if reason is None:
                results.extend(CommitResult(pt.placement.job.job_id, True, pt.epoch) for pt in batch)
            else:
                results.extend(self._commit_one(pt.placement, quotas, now, lane) for pt in batch)

        for batch in commit_groups([_parts(self.names, p, now) for p in placements], group, lane):
            flush(batch)
        return results

    # ------------------------------------------------------------ the lanes' quota escrow (gpufleet.store.escrow)

    def escrow(self, lane: str) -> Amounts:
        return amounts_from_item(self.db.get(self.names.control, (escrow_pk(lane), ESCROW_SK)))

    def _move(self, lane: str, path: str, per_type: dict[str, int], sign: int) -> None:
        self._add(self.names.control, (quota_pk(path), QUOTA_SK), {usage_attr(t): sign * n for t, n in per_type.items()})
        self._add(self.names.control, (escrow_pk(lane), ESCROW_SK),
                  {escrow_attr(path, t): sign * n for t, n in per_type.items()})

    def reserve(self, lane: str, needs: Amounts, quotas: dict[str, QuotaNode]) -> Amounts:
        """As :func:`gpufleet.store.escrow.reserve`: each level granted what its limit leaves, up to the need."""
        granted: Amounts = {}
        with self.db.lock:
            for path, per_type in sorted(needs.items()):
                used = usage_from_item(self.db.get(self.names.control, (quota_pk(path), QUOTA_SK)) or {})
                left = {t: n if (lim := limit_of(quotas, path, t)) is None else max(0, min(n, lim - used.get(t, 0)))
                        for t, n in per_type.items() if n > 0}
                left = {t: n for t, n in left.items() if n > 0}
                if left:
                    self._move(lane, path, left, 1)
                    granted[path] = left
        return granted

    def give_back(self, lane: str, amounts: Amounts) -> None:
        with self.db.lock:
            held = amounts_from_item(self.db.get(self.names.control, (escrow_pk(lane), ESCROW_SK)))
            for path, per_type in amounts.items():
                if any(n > held.get(path, {}).get(t, 0) for t, n in per_type.items() if n > 0):
                    raise TransientError(f"escrow of lane {lane}: give-back refused (holds less than {amounts})")
            for path, per_type in sorted(amounts.items()):
                back = {t: n for t, n in per_type.items() if n > 0}
                if back:
                    self._move(lane, path, back, -1)

    # ------------------------------------------------------------ release

    def release(self, job_id: str, epoch: int, *, clock: Clock) -> bool:
        jobs, control = self.names.jobs, self.names.control
        with self.db.lock:
            att = self.db.get(jobs, (job_pk(job_id), attempt_sk(epoch)))
            if att is None:
                raise NotFound(f"attempt {epoch} of {job_id} not found")
            if att.get("released_at") is not None:
                return False
            att["released_at"] = iso(clock.now())
            self.db.put(jobs, att)
            ch = att.get("charge") or {}
            members = ch.get("members") or []
            if members and members[0].get("node") is None:
                pool = ch.get("pool", "")
                self._add(control, (alloc_pk(pool), POOL_SK), {"used_milli": -int(ch.get("charge_milli", 0))})
                self.db.delete(control, (alloc_pk(pool), alloc_sk(job_id, epoch)))
            else:
                per_gpu = int(ch.get("gpu_milli", MILLI))
                for m in members:
                    gs = [int(g) for g in m.get("gpu_indices") or []]
                    if gs:
                        self._add(control, (alloc_pk(m["node"]), BOOK_SK), {f"g{g}": -per_gpu for g in gs})
                    self.db.delete(control, (alloc_pk(m["node"]), alloc_sk(job_id, epoch)))
            if ch:
                n = -int(ch["charge_milli"])
                for path in ancestors(ch["owner_path"]):
                    self._add(control, (quota_pk(path), QUOTA_SK),
                              {usage_attr(ch["gpu_type"]): n, usage_attr(ALL_TYPES): n})
            return True

    # ------------------------------------------------------------ preemption, backoff, expiry

    def _update_job(self, job_id: str, when: Callable[[dict[str, Any]], bool], attrs: dict[str, Any]) -> bool:
        with self.db.lock:
            item = self.db.get(self.names.jobs, (job_pk(job_id), JOB_META))
            if item is None or not when(item):
                return False
            item.update(attrs)
            self.db.put(self.names.jobs, stored(item))
            return True

    def request_preemption(self, victim: Allocation, by_job: str, now: float) -> bool:
        with self.db.lock:
            asked = self._update_job(
                victim.job_id, lambda it: "current_epoch" in it and int(it["current_epoch"]) == victim.epoch,
                {"preempt_requested": {"epoch": victim.epoch, "by": by_job, "at": iso(now)}, "last_preempted_at": now})
            if not asked:
                return False
            for m in victim.members:
                key = (alloc_pk(m.node or victim.pool), alloc_sk(victim.job_id, victim.epoch))
                record = self.db.get(self.names.control, key)
                if record is not None:  # an allocation record already gone (released) is skipped
                    record.update(preempt_requested=True, last_preempted_at=now)
                    self.db.put(self.names.control, stored(record))
            return True

    def record_backoff(self, job_id: str, until: float, reason: str, shape: str = "") -> None:
        with self.db.lock:  # the read of the count and the write are one step, as the UpdateItem's ADD
            item = self.db.get(self.names.jobs, (job_pk(job_id), JOB_META))
            attempts = int(item.get("sched_attempts", 0)) + 1 if item is not None else 1
            self._update_job(job_id, _pending, {"sched_backoff_until": until, "sched_reason": reason[:500],
                                                "sched_shape": shape, "sched_attempts": attempts})

    def record_reason(self, job_id: str, reason: str) -> None:
        self._update_job(job_id, _pending, {"sched_reason": reason[:500]})

    def expire(self, job_id: str, token: str | None, reason: str) -> bool:
        return False


def _pending(item: dict[str, Any]) -> bool:
    return item.get("status") == JobStatus.PENDING.value
