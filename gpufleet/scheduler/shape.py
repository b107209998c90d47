"""The cluster's static shape as a fingerprint: what an UNRESOLVABLE decision was judged on (pure).

A job that can never fit as the cluster is configured (``Outcome.UNRESOLVABLE``) backs off exponentially
(:func:`gpufleet.scheduler.results.requeue_for`, by its own scheduling attempts) and is retried rarely. Its
backoff records :func:`cluster_shape` of the snapshot it was judged on; a later pass whose snapshot has another
fingerprint considers it again at once, whatever its backoff says (as Kueue requeues inadmissible workloads on
cluster events): a node of its pool registered or came back, a pool was configured.

What goes in is exactly what the static verdicts read (:mod:`gpufleet.scheduler.pool_policy`: the allowlist
scope, ``gpu-type``, ``residency``, ``fits-ever``) and the names of the configured scopes and static filters:

- each pool's name, kind, region, GPU type, size (``max_gpus``) and whether it runs gangs;
- each *usable* on-prem node (not draining, not expired: the pass sees only those) by id, pool, GPU type and
  number of GPUs.

Never free capacity, bookings, heartbeat times, cached models or prices: those change all the time and decide
only UNSCHEDULABLE (which is retried every pass anyway) or the score, so folding them in would wake every parked
job at every pass. The fingerprint does not depend on the order of pools or nodes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from gpufleet.pools import Pool
from gpufleet.scheduler.model import NodeState

#: hex digits kept of the SHA-256 (64 bits: a collision only delays a parked job to its backoff's end)
FINGERPRINT_HEX = 16


def pool_shape(pool: Pool) -> tuple:
    """What of ``pool`` a static verdict reads."""
    return (pool.name, pool.kind.value, pool.region, pool.gpu_type, int(pool.max_gpus), bool(pool.gangs))


def node_shape(node: NodeState) -> tuple:
    """What of a usable ``node`` a static verdict reads (not its free capacity)."""
    return (node.node_id, node.pool, node.gpu_type, len(node.gpu_free))


def cluster_shape(pools: Iterable[Pool], nodes: Iterable[NodeState], now: float,
                  plugins: Iterable[str] = ()) -> str:
    """The fingerprint of the static shape (see the module docstring): equal inputs in any order give the same
    string, a change to any part of any pool's or usable node's shape (or the set of them) another one.
    ``plugins``: the configured scope and static filter names."""
    parts = sorted(repr(pool_shape(p)) for p in pools)
    parts.append("|")
    parts += sorted(repr(node_shape(n)) for n in nodes if n.usable(now))
    parts.append("|")
    parts += sorted(set(plugins))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:FINGERPRINT_HEX]
