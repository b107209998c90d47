"""Quota tree (tenant → team → user): hard limits, guarantees, borrowing and DRF shares.

Contract:
- A charge of ``m`` milli of GPU type ``t`` to ``tenant/team/user`` is allowed
  only if, at every level that has a :class:`QuotaNode`, usage of ``t`` and of
  ``"*"`` stays within that node's limit (guarantee + borrowing limit). The store
  enforces the same rule atomically in its transaction; this is the pass's view.
- Usage above a node's guarantee is *borrowed* idle capacity and may be reclaimed
  by preemption (:mod:`gpufleet.scheduler.preempt`).
- The weighted dominant share of a path is ``max_t usage_t / (capacity_t * weight_t)``.
- :meth:`QuotaLedger.overlay` is a copy-on-write view for trial charges (preemption's
  what-ifs): reads fall through to the ledger, writes stay in the view, so a trial
  costs what it touches, not a copy of every path's usage.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from gpufleet.scheduler.model import ALL_TYPES, QuotaNode, ancestors


class QuotaLedger:
    """Working copy of quota usage for one pass (or one simulation)."""

    def __init__(self, quotas: Mapping[str, QuotaNode], usage: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self.quotas = dict(quotas)
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for path, per_type in (usage or {}).items():
            for t, v in per_type.items():
                self.usage[path][t] = int(v)

    def used(self, path: str, gpu_type: str) -> int:
        return int(self.usage.get(path, {}).get(gpu_type, 0))

    def violation(self, owner_path: str, gpu_type: str, milli: int) -> str | None:
        """The first path whose limit the charge would exceed, or None if it fits."""
        for path in ancestors(owner_path):
            q = self.quotas.get(path)
            if q is None:
                continue
            for key in {gpu_type, ALL_TYPES}:
                lim = q.limit(key)
                if lim is not None and self.used(path, key) + milli > lim:
                    return path
        return None

    def _set(self, path: str, gpu_type: str, milli: int) -> None:
        self.usage[path][gpu_type] = milli

    def charge(self, owner_path: str, gpu_type: str, milli: int) -> None:
        for path in ancestors(owner_path):
            for key in (gpu_type, ALL_TYPES):
                self._set(path, key, self.used(path, key) + milli)

    def refund(self, owner_path: str, gpu_type: str, milli: int) -> None:
        for path in ancestors(owner_path):
            for key in (gpu_type, ALL_TYPES):
                self._set(path, key, max(0, self.used(path, key) - milli))

    def borrowing(self, path: str, gpu_type: str) -> int:
        """Milli of ``gpu_type`` that ``path`` uses above its guarantee (0 without a quota node)."""
        q = self.quotas.get(path)
        if q is None:
            return 0
        return max(0, self.used(path, gpu_type) - q.guaranteed(gpu_type))

    def within_guarantee(self, owner_path: str, gpu_type: str, milli: int) -> bool:
        """True when every level with a guarantee for ``gpu_type`` stays within it after the charge."""
        any_node = False
        for path in ancestors(owner_path):
            q = self.quotas.get(path)
            if q is None or q.guaranteed(gpu_type) == 0:
                continue
            any_node = True
            if self.used(path, gpu_type) + milli > q.guaranteed(gpu_type):
                return False
        return any_node

    def borrowed_at(self, owner_path: str, gpu_type: str) -> bool:
        """True when any level of ``owner_path`` is above its guarantee for ``gpu_type``."""
        return any(self.borrowing(p, gpu_type) > 0 for p in ancestors(owner_path) if p in self.quotas)

    def dominant_share(self, path: str, capacity: Mapping[str, int]) -> float:
        """Weighted dominant share of ``path`` over the GPU types in ``capacity`` (milli per type)."""
        q = self.quotas.get(path)
        best = 0.0
        for t, cap in capacity.items():
            if cap <= 0 or t == ALL_TYPES:
                continue
            w = q.weight_for(t) if q else 1.0
            best = max(best, self.used(path, t) / (cap * max(w, 1e-9)))
        return best

    def copy(self) -> QuotaLedger:
        return QuotaLedger(self.quotas, {p: dict(v) for p, v in self.usage.items()})

    def overlay(self) -> QuotaLedger:
        """A copy-on-write view of this ledger (see module docstring); this ledger must not change meanwhile."""
        return _Overlay(self)


class _Overlay(QuotaLedger):
    """Trial charges over a base ledger: reads fall through, writes are kept here (O(touched))."""

    def __init__(self, base: QuotaLedger) -> None:
        self.quotas = base.quotas
        self._base = base
        self._delta: dict[tuple[str, str], int] = {}

    def used(self, path: str, gpu_type: str) -> int:
        v = self._delta.get((path, gpu_type))
        return self._base.used(path, gpu_type) if v is None else v

    def _set(self, path: str, gpu_type: str, milli: int) -> None:
        self._delta[(path, gpu_type)] = milli

    def copy(self) -> QuotaLedger:
        out = self._base.copy()
        for (path, key), v in self._delta.items():
            out._set(path, key, v)
        return out
