"""The extension points of a scheduling pass, as typed Protocols.

The cycle (:mod:`gpufleet.scheduler.cycle`) calls them in numbered steps for each job:

1. **order** — a :class:`QueueSort` orders the pending jobs;
2. **filter** — :class:`Scope` plugins narrow the pools the job is considered for at
   all (every later step sees only those; the ``allowlist`` scope is always on), then
   :class:`Filter` plugins keep the pools the job may use (``UNRESOLVABLE`` when none
   ever could, ``UNSCHEDULABLE`` when none can now);
3. **score** — the job's pool policy (a :class:`Score`) ranks the remaining pools;
4. **reserve** — a :class:`Reserve` takes capacity for every gang member (all or nothing),
   placing each on a node with the configured :class:`PackingPolicy`;
5. **preempt** — when nothing fits, a :class:`Preempt` may pick victims;
6. **commit** — done by the store, outside the pure core.

Plugins are stateless (a memo of a pure function is allowed) and handed the
:class:`~gpufleet.scheduler.context.PassContext`. They import only the context and
the data modules, never the registry (:mod:`gpufleet.scheduler.registry`) or the cycle.
"""

from __future__ import annotations

from typing import Protocol

from gpufleet.pools import Pool
from gpufleet.scheduler.context import Choice, PackingPolicy, PassContext, Placement
from gpufleet.scheduler.model import Allocation, PendingJob
from gpufleet.scheduler.results import Status

__all__ = ["Choice", "Filter", "PackingPolicy", "Preempt", "QueueSort", "Reserve", "Scope", "Score"]


class QueueSort(Protocol):
    def sort(self, jobs: list[PendingJob], ctx: PassContext) -> list[PendingJob]: ...


class Scope(Protocol):
    def narrow(self, job: PendingJob, pools: list[Pool], ctx: PassContext) -> list[Pool] | Status:
        """The pools of ``pools`` the job may be considered for, or its status when none is left."""
        ...


class Filter(Protocol):
    def filter(self, job: PendingJob, pool: Pool, ctx: PassContext) -> Status: ...


class Score(Protocol):
    def score(self, job: PendingJob, pool: Pool, ctx: PassContext) -> float:
        """Cost of running ``job`` in ``pool``: lower is better."""
        ...


class Reserve(Protocol):
    def reserve(self, job: PendingJob, pool: Pool, ctx: PassContext, *, strict_avoid: bool = False) -> Placement | Status:
        """Reserve every member or none. Nodes in ``job.avoid_nodes`` are never used when
        ``strict_avoid``, otherwise only when no other node of the pool fits that member."""
        ...

    def unreserve(self, placement: Placement, ctx: PassContext) -> None: ...


class Preempt(Protocol):
    def victims(self, job: PendingJob, pools: list[Pool], ctx: PassContext) -> tuple[list[Allocation], Status | None]:
        """Victims to preempt for ``job`` and the job's status (None: preemption has nothing to say)."""
        ...
