"""The scheduler pass's DynamoDB stores in one bundle (:class:`gpufleet.scheduler.passes.PassStores`)."""

from __future__ import annotations

from gpufleet.scheduler.passes import PassStores
from gpufleet.scheduler.shards import PassShard
from gpufleet.store.lease import DynamoLease
from gpufleet.store.placements import DynamoPlacementStore
from gpufleet.store.queueview import DynamoQueueViewStore
from gpufleet.store.snapshot import DynamoSnapshotReader
from gpufleet.tables import QUEUE_VIEW_SK, TableNames


def pass_stores(client, names: TableNames, *, sfn=None, shard: PassShard | None = None) -> PassStores:
    """Snapshot reader, placement store (``sfn`` completes placement tokens), the lease of ``shard`` (default: the
    one unsharded pass) and queue view over ``client``."""
    shard = shard or PassShard()
    return PassStores(
        snapshot=DynamoSnapshotReader(client, names),
        placements=DynamoPlacementStore(client, names, sfn=sfn),
        lease=DynamoLease(client, names.control, shard.lease_pk),
        queue=DynamoQueueViewStore(client, names.control,
                                   QUEUE_VIEW_SK if shard.whole else f"{QUEUE_VIEW_SK}#{shard.index}of{shard.count}"),
    )
