"""The scheduler pass's stores in memory (:class:`gpufleet.scheduler.passes.PassStores` over one
:class:`~gpufleet.store.fakes.memory.MemoryDatabase`), the fakes' counterpart of
:func:`gpufleet.store.scheduling.pass_stores`."""

from __future__ import annotations

from gpufleet.scheduler.passes import PassStores
from gpufleet.scheduler.shards import PassShard
from gpufleet.store.fakes.lease import MemoryLease
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.placements import MemoryPlacementStore
from gpufleet.store.fakes.queueview import MemoryQueueViewStore
from gpufleet.store.fakes.snapshot import MemorySnapshotReader
from gpufleet.tables import QUEUE_VIEW_SK


def memory_pass_stores(db: MemoryDatabase, shard: PassShard | None = None) -> PassStores:
    """Snapshot reader, placement store, the lease of ``shard`` (default: the one unsharded pass) and queue view
    over ``db``."""
    shard = shard or PassShard()
    return PassStores(snapshot=MemorySnapshotReader(db), placements=MemoryPlacementStore(db),
                      lease=MemoryLease(db, pk=shard.lease_pk),
                      queue=MemoryQueueViewStore(db, sk=QUEUE_VIEW_SK if shard.whole
                                                 else f"{QUEUE_VIEW_SK}#{shard.index}of{shard.count}"))
