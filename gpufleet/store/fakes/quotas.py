"""In-memory :class:`~gpufleet.store.quotas.QuotaStore`: quota nodes of the control table.

:meth:`MemoryQuotaStore.put` sets the same attributes as the DynamoDB store's update (configuration,
``path``, directory attribute) and keeps whatever usage counters the item holds; reads drop the key
attributes and return ``None`` for a path without a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.scheduler.model import QuotaNode
from gpufleet.store.fakes.jobs import stored
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.tables import DIR_QUOTAS, DIRECTORY_ATTR, QUOTA_SK, quota_pk


@dataclass
class MemoryQuotaStore:
    db: MemoryDatabase
    table: str = "control"

    def put(self, node: QuotaNode) -> None:
        key = (quota_pk(node.path), QUOTA_SK)
        limits = {t: node.limit(t) for t in set(node.guarantee) | set(node.borrow_limit)}
        with self.db.lock:
            item = self.db.get(self.table, key) or {"pk": key[0], "sk": key[1]}
            item.update(guarantee=dict(node.guarantee), borrow_limit=dict(node.borrow_limit),
                        weight={k: float(v) for k, v in node.weight.items()}, limits=limits, path=node.path)
            item[DIRECTORY_ATTR] = DIR_QUOTAS
            self.db.put(self.table, stored(item))

    def read_nodes(self, paths: list[str]) -> dict[str, dict[str, Any] | None]:
        found: dict[str, dict[str, Any] | None] = {}
        for p in paths:
            item = self.db.get(self.table, (quota_pk(p), QUOTA_SK))
            found[p] = None if item is None else {k: v for k, v in item.items() if k not in ("pk", "sk")}
        return found
