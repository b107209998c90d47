"""In-memory :class:`~gpufleet.store.snapshot.SnapshotReader` over the fakes' shared database.

It reads what the DynamoDB reader reads, the same way: PENDING job items are the jobs table's gsi3 members
(``gsi3pk`` one of :data:`~gpufleet.tables.PENDING_PARTITIONS`, or of a sharded pass's own partitions) merged in ``gsi3sk`` order, cut to ``limit`` and projected to
:data:`~gpufleet.store.snapshot.PENDING_PROJECTION` (so a pass that needed the command, env or prompt fails
here as it would on DynamoDB); control items are those listed under the directory partitions; tenant defaults
come from the ``TENANT#<t>`` items' ``placement_policy``. The items become a snapshot through
:func:`~gpufleet.store.snapshot.assemble_snapshot`, the DynamoDB reader's own assembly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gpufleet.pools import Pool
from gpufleet.scheduler.model import Snapshot
from gpufleet.scheduler.shards import PassShard
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.snapshot import PENDING_PROJECTION, SCHEDULER_DIRECTORY, assemble_snapshot, merge_pending
from gpufleet.tables import DIRECTORY_ATTR, PENDING_PARTITIONS, TENANT_SK, tenant_pk


def project(item: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """``item`` cut to the attribute ``paths`` (``#a.#b`` as in a ProjectionExpression)."""
    out: dict[str, Any] = {}
    for path in paths:
        names = [p.lstrip("#") for p in path.split(".")]
        src, dst = item, out
        for i, name in enumerate(names):
            if not isinstance(src, dict) or name not in src:
                break
            if i == len(names) - 1:
                dst[name] = src[name]
            else:
                src, dst = src[name], dst.setdefault(name, {})
    return out


@dataclass
class MemorySnapshotReader:
    db: MemoryDatabase
    jobs_table: str = "jobs"
    control_table: str = "control"
    parts: tuple[str, ...] = SCHEDULER_DIRECTORY

    def pending(self, limit: int | None, partitions: tuple[str, ...] = PENDING_PARTITIONS) -> list[dict[str, Any]]:
        if limit == 0:
            return []
        with self.db.lock:
            parts = [sorted((it for it in self.db.table(self.jobs_table).values() if it.get("gsi3pk") == part),
                            key=lambda it: str(it.get("gsi3sk", ""))) for part in partitions]
            return copy.deepcopy([project(it, PENDING_PROJECTION) for it in merge_pending(parts, limit)])

    def _control(self) -> list[dict[str, Any]]:
        with self.db.lock:
            items = list(self.db.table(self.control_table).values())
            return copy.deepcopy([it for part in self.parts for it in items if it.get(DIRECTORY_ATTR) == part])

    def _policies(self, tenants: set[str]) -> dict[str, str]:
        out = {}
        for t in sorted(tenants):
            item = self.db.get(self.control_table, (tenant_pk(t), TENANT_SK)) or {}
            if item.get("placement_policy"):
                out[t] = item["placement_policy"]
        return out

    def load(self, pools: tuple[Pool, ...], now: float, *, limit: int | None = None,
             shard: PassShard | None = None) -> Snapshot:
        shard = shard or PassShard()
        return assemble_snapshot(self.pending(limit, shard.partitions), self._control(), self._policies, pools, now,
                                 shard=shard)
