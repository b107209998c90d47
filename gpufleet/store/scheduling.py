"""The scheduler pass's DynamoDB stores in one bundle (:class:`gpufleet.scheduler.passes.PassStores`)."""

from __future__ import annotations

from gpufleet.scheduler.passes import PassStores
from gpufleet.store.lease import DynamoLease
from gpufleet.store.placements import DynamoPlacementStore
from gpufleet.store.queueview import DynamoQueueViewStore
from gpufleet.store.snapshot import DynamoSnapshotReader
from gpufleet.tables import TableNames


def pass_stores(client, names: TableNames, *, sfn=None) -> PassStores:
    """Snapshot reader, placement store (``sfn`` completes placement tokens), lease and queue view over ``client``."""
    return PassStores(
        snapshot=DynamoSnapshotReader(client, names),
        placements=DynamoPlacementStore(client, names, sfn=sfn),
        lease=DynamoLease(client, names.control),
        queue=DynamoQueueViewStore(client, names.control),
    )
