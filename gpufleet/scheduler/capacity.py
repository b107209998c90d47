"""Free and fragmented GPU capacity per pool after a pass's placements (pure; for the pass report).

Contract: :func:`pool_capacity` takes the pass's snapshot and the placements it made and returns, for
every configured pool, ``PoolCapacity(free_gpus, fragmented_gpus)`` in GPUs (milli / 1000):

- on-prem pool: over its usable nodes (not draining, not expired), the free milli of every GPU after
  the placements' bookings (each member's ``gpu_indices``, ``gpu_milli`` each); *fragmented* is the
  free milli on GPUs that are partly used (0 < free < 1000): capacity no whole-GPU job can take;
- cloud pool: ``max_gpus`` minus the milli in use (snapshot ``pool_used`` plus the placements'
  ``charge_milli``), never below 0; cloud capacity is never fragmented.

A snapshot is taken before the pass, so this is what the pass left: GPUs free while jobs stayed
PENDING are the first sign of fragmentation, quota or affinity losses (docs/operations.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import Snapshot
from gpufleet.scheduler.nodetable import MILLI


@dataclass(frozen=True)
class PoolCapacity:
    free_gpus: float
    fragmented_gpus: float


def pool_capacity(snapshot: Snapshot, placements: Iterable[Placement]) -> dict[str, PoolCapacity]:
    """Capacity left per pool name (see module contract)."""
    placements = list(placements)
    booked: dict[tuple[str, int], int] = defaultdict(int)
    charged: dict[str, int] = defaultdict(int)
    for p in placements:
        charged[p.pool.name] += p.charge_milli
        milli = p.job.gpu_milli if p.job.num_gpu else 0
        for m in p.members:
            if m.node is not None:
                for idx in m.gpu_indices:
                    booked[(m.node, idx)] += milli
    out: dict[str, PoolCapacity] = {}
    for pool in snapshot.pools:
        if pool.kind.is_cloud:
            used = snapshot.pool_used.get(pool.name, 0) + charged[pool.name]
            out[pool.name] = PoolCapacity(max(0, pool.max_gpus * MILLI - used) / MILLI, 0.0)
            continue
        free = frag = 0
        for n in snapshot.nodes:
            if n.pool != pool.name or not n.usable(snapshot.now):
                continue
            for idx, f in enumerate(n.gpu_free):
                left = max(0, f - booked[(n.node_id, idx)])
                free += left
                if 0 < left < MILLI:
                    frag += left
        out[pool.name] = PoolCapacity(free / MILLI, frag / MILLI)
    return out
