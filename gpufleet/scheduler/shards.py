"""Sharded scheduler passes: which pending jobs and which on-prem nodes one pass owns.

A deployment runs ``count`` passes side by side (one scheduler Lambda invocation per shard, each fanned out by
its own EventBridge rules with the input ``{"shard": i}``), each under its own lease
(:func:`gpufleet.tables.scheduler_lease_pk`). Shard ``index`` of ``count`` in round ``round``:

- **pending jobs**: the gsi3 partitions ``PENDING#<p>`` with ``(p + round) % count == index`` (the unsharded
  ``PENDING`` partition, a leftover from before the 16 partitions, goes with ``PENDING#0``); a job's partition is
  fixed by its id, so every pending job belongs to exactly one shard in a round;
- **on-prem nodes**: those with ``hash(round, node id) % count == index``, with their bookings and the running
  allocations on them (the preemption candidates). Node ownership moves every round, so a job meets every node
  over a few rounds and a shard with more demand than its nodes hold does not keep its jobs waiting for ever;
- **global** (every shard reads and writes them): cloud pools' usage counters, quota usage, tenant defaults and
  the running allocations on cloud pools. Every write to them is conditional (a cloud pool's ``used_milli`` never
  past ``max_gpus``; a quota level's usage never past its limit, taken into a lane's escrow by a conditional write,
  :mod:`gpufleet.store.escrow`), so concurrent shards cannot overdraw them: the loser's placement is not
  committed and the job is decided again by a later pass.

The round is ``int(now // rotation_s)`` of the pass's clock: shards started in one trigger agree on it. Two shards
that disagree (a pass started at the edge of a round) may own a node both: their bookings are conditional writes
(``g<i> <= 1000 - m``), so one of them loses that placement, nothing is double-booked. Disjoint ownership saves
wasted work; it is never what keeps the bookings right.

``count == 1`` (the default) owns everything: the pass of before sharding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gpufleet.tables import PENDING_PARTITION, PENDING_PARTITIONS, scheduler_lease_pk

#: the most shards a deployment may run (the 16 PENDING partitions: a shard owns at least one)
MAX_SHARDS = 16
#: how long node and partition ownership lasts before it rotates (seconds of the pass clock)
ROTATION_S = 600.0


def _stable(text: str) -> int:
    return int(hashlib.blake2b(text.encode(), digest_size=8).hexdigest(), 16)


@dataclass(frozen=True)
class PassShard:
    """Shard ``index`` of ``count`` in ownership round ``round`` (see the module docstring)."""

    index: int = 0
    count: int = 1
    round: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count}: need 0 <= index < count <= {MAX_SHARDS}")

    @classmethod
    def at(cls, index: int, count: int, now: float, rotation_s: float = ROTATION_S) -> PassShard:
        """Shard ``index`` of ``count`` in the round of ``now``."""
        return cls(index, count, int(now // rotation_s) if count > 1 else 0)

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def lease_pk(self) -> str:
        return scheduler_lease_pk(self.index, self.count)

    def owns_partition(self, part: str) -> bool:
        """Whether the gsi3 partition ``part`` (``PENDING`` or ``PENDING#<p>``) is read by this shard."""
        if self.whole:
            return True
        p = 0 if part == PENDING_PARTITION else int(part.rsplit("#", 1)[1])
        return (p + self.round) % self.count == self.index

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(p for p in PENDING_PARTITIONS if self.owns_partition(p))

    def owns_node(self, node_id: str) -> bool:
        """Whether on-prem node ``node_id`` (its capacity, bookings and allocations) belongs to this shard."""
        return self.whole or _stable(f"{self.round}:{node_id}") % self.count == self.index

    def lanes(self, n: int) -> tuple[str, ...]:
        """The names of this shard's ``n`` commit lanes (each with its own quota escrow item)."""
        return tuple(f"{self.index}of{self.count}.{k}" for k in range(n))

    def as_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count, "round": self.round}
