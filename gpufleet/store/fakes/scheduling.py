"""The scheduler pass's stores in memory (:class:`gpufleet.scheduler.passes.PassStores` over one
:class:`~gpufleet.store.fakes.memory.MemoryDatabase`), the fakes' counterpart of
:func:`gpufleet.store.scheduling.pass_stores`."""

from __future__ import annotations

from gpufleet.scheduler.passes import PassStores
from gpufleet.store.fakes.lease import MemoryLease
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.placements import MemoryPlacementStore
from gpufleet.store.fakes.queueview import MemoryQueueViewStore
from gpufleet.store.fakes.snapshot import MemorySnapshotReader


def memory_pass_stores(db: MemoryDatabase) -> PassStores:
    """Snapshot reader, placement store, lease and queue view over ``db``."""
    return PassStores(snapshot=MemorySnapshotReader(db), placements=MemoryPlacementStore(db), lease=MemoryLease(db),
                      queue=MemoryQueueViewStore(db))
