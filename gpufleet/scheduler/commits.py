"""A pass's commits in parallel lanes, each drawing its quota from its own escrow.

Contract (:func:`commit_lanes`):
- The placements are dealt to the pass's lanes by their first member's node (a cloud placement by its pool), so a
  lane's group transactions touch its own nodes' booking items and its own escrow item, and lanes do not contend
  (a gang across lanes' nodes may: that transaction is retried on ``TransactionConflict``, see below).
- Before its snapshot, the pass gives back what its lanes' escrows still hold (:func:`recover`: a pass of its shard
  that died before giving back).
- Each lane, ``parallelism`` at a time (threads): reserves the quota its placements need (:meth:`PlacementStore.reserve`: conditional writes on the
  quota items, so concurrent lanes and shards can never take more than a level's limit), keeps its placements in
  queue order while the grant covers them (:func:`trim`) — the rest are lost this pass (``lost: quota taken by a
  concurrent pass``) and decided again by the next one —, group-commits them with the quota drawn from its escrow
  (:meth:`PlacementStore.commit_many` with ``lane``), then gives back what it did not use.
- A group transaction cancelled by a failed condition (a GPU booked meanwhile, a job no longer PENDING at the
  snapshot's epoch) falls back to one transaction per placement; a placement whose own transaction fails stays
  PENDING and is re-decided by the next pass on fresh state — never committed over the condition. A transaction
  cancelled only by ``TransactionConflict`` is tried again as it is (the store's retry with jittered backoff).
- A lane whose give-back fails leaves its escrow held (counted as used: quota is never overdrawn, only held) until
  its next pass gives it back; the error is logged, the pass goes on.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from gpufleet.errors import TransientError
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import ALL_TYPES, QuotaNode, ancestors
from gpufleet.store.escrow import Amounts
from gpufleet.store.placements import CommitResult, PlacementStore

_log = logging.getLogger(__name__)

#: why a placement the lane could not reserve quota for was not committed
QUOTA_TAKEN = "lost: quota taken by a concurrent pass"


def charges(p: Placement) -> Amounts:
    """What ``p`` charges each level of its owner's quota path: its GPU type and ``*``."""
    m = p.charge_milli
    per_type: dict[str, int] = defaultdict(int)
    per_type[p.gpu_type] += m
    per_type[ALL_TYPES] += m
    return {path: dict(per_type) for path in ancestors(p.job.owner_path)}


def add(total: Amounts, more: Amounts, sign: int = 1) -> Amounts:
    """``total`` ± ``more`` (a new mapping)."""
    out = {path: dict(pt) for path, pt in total.items()}
    for path, pt in more.items():
        row = out.setdefault(path, {})
        for t, n in pt.items():
            row[t] = row.get(t, 0) + sign * n
    return out


def needs(placements: list[Placement]) -> Amounts:
    total: Amounts = {}
    for p in placements:
        total = add(total, charges(p))
    return total


def trim(placements: list[Placement], granted: Amounts) -> tuple[list[Placement], list[Placement]]:
    """The placements (in their order) the grant covers, and the rest."""
    left = {path: dict(pt) for path, pt in granted.items()}
    kept, dropped = [], []
    for p in placements:
        ch = charges(p)
        if all(left.get(path, {}).get(t, 0) >= n for path, pt in ch.items() for t, n in pt.items()):
            for path, pt in ch.items():
                for t, n in pt.items():
                    left[path][t] -= n
            kept.append(p)
        else:
            dropped.append(p)
    return kept, dropped


def lane_of(p: Placement, lanes: int) -> int:
    """The lane of a placement: a stable hash of its first member's node (a cloud placement: its pool)."""
    key = next((m.node for m in p.members if m.node), None) or p.pool.name
    return int(hashlib.blake2b(key.encode(), digest_size=4).hexdigest(), 16) % lanes


def _lane(store: PlacementStore, lane: str, placements: list[Placement], quotas: dict[str, QuotaNode], now: float,
          group: int) -> list[CommitResult]:
    if not placements:
        return []
    granted = store.reserve(lane, needs(placements), quotas)
    kept, dropped = trim(placements, granted)
    results = store.commit_many(kept, quotas, now, group=group, lane=lane) if kept else []
    by_id = {p.job.job_id: p for p in kept}
    # charged from the escrow by a transaction that landed (a placement released afterwards gave its charge back to
    # the quota item itself, through the release)
    used = needs([by_id[r.job_id] for r in results if r.landed and r.job_id in by_id])
    unused = {path: {t: n for t, n in pt.items() if n > 0} for path, pt in add(granted, used, -1).items()}
    try:
        store.give_back(lane, {path: pt for path, pt in unused.items() if pt})
    except TransientError as err:  # held in the escrow (counted as used) until the lane's next pass
        _log.warning("escrow of lane %s not given back: %s", lane, err)
    return results + [CommitResult(p.job.job_id, False, reason=QUOTA_TAKEN) for p in dropped]


def recover(store: PlacementStore, lanes: tuple[str, ...]) -> int:
    """Give back what ``lanes``' escrows still hold (a pass of this shard that died before giving back); run before
    the snapshot, so the pass sees that quota free. How many lanes held some."""
    held = 0
    for lane in lanes:
        left = store.escrow(lane)
        if left:
            try:
                store.give_back(lane, left)
            except TransientError as err:  # still held (counted as used); the next pass tries again
                _log.warning("escrow of lane %s not recovered: %s", lane, err)
            held += 1
    return held


def commit_lanes(store: PlacementStore, placements: list[Placement], quotas: dict[str, QuotaNode], now: float, *,
                 lanes: tuple[str, ...], group: int = 20, parallelism: int | None = None) -> list[CommitResult]:
    """Commit ``placements`` over ``lanes`` (see the module docstring)."""
    dealt: dict[int, list[Placement]] = defaultdict(list)
    for p in placements:
        dealt[lane_of(p, len(lanes))].append(p)
    work = [(name, dealt.get(i, [])) for i, name in enumerate(lanes)]
    workers = max(1, min(parallelism or len(lanes), len(lanes)))
    if workers == 1:
        return [r for name, ps in work for r in _lane(store, name, ps, quotas, now, group)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_lane, store, name, ps, quotas, now, group) for name, ps in work]
    return [r for f in futures for r in f.result()]
