"""Extension points of the scheduling cycle, their registry and the validated configuration.

The cycle (:mod:`gpufleet.scheduler.cycle`) runs numbered steps for each pass:

1. **order** — a :class:`QueueSort` orders the pending jobs;
2. **filter** — only the job's allowlisted pools are candidates (always, whatever the
   configuration); :class:`Filter` plugins keep those the job may use
   (``UNRESOLVABLE`` when none ever could, ``UNSCHEDULABLE`` when none can now);
3. **score** — the job's pool policy (a :class:`Score`) ranks the remaining pools;
4. **reserve** — a :class:`Reserve` takes capacity for every gang member (all or nothing),
   keeping off the nodes the job failed on (strictly first, then only as a last resort);
5. **preempt** — when nothing fits, a :class:`Preempt` may pick victims;
6. **commit** — done by the store (one transaction per placement), outside the pure core.

Plugins are stateless (a memo of a pure function is allowed), handed the pass
context, and named: a name → factory :data:`REGISTRY` and a pydantic
:class:`SchedulerConfig` that rejects unknown names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.errors import ConfigError
from gpufleet.pools import Pool
from gpufleet.scheduler.model import Allocation, PendingJob
from gpufleet.scheduler.results import Status

if TYPE_CHECKING:
    from gpufleet.scheduler.cycle import PassContext, Placement


class QueueSort(Protocol):
    def sort(self, jobs: list[PendingJob], ctx: PassContext) -> list[PendingJob]: ...


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


KINDS = ("queue_sort", "filter", "score", "reserve", "preempt")
REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {k: {} for k in KINDS}


def register(kind: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Class decorator: make ``factory`` available as ``name`` for extension point ``kind``."""
    if kind not in REGISTRY:
        raise ValueError(f"unknown extension point {kind!r}")

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY[kind][name] = factory
        return factory

    return deco


def build(kind: str, name: str, **kwargs: Any) -> Any:
    _load_builtins()
    try:
        return REGISTRY[kind][name](**kwargs)
    except KeyError:
        raise ConfigError(f"no {kind} plugin named {name!r}; known: {', '.join(sorted(REGISTRY[kind]))}") from None


def _load_builtins() -> None:
    # importing registers the built-in plugins
    from gpufleet.scheduler import gang, ordering, pool_policy, preempt  # noqa: F401


class SchedulerConfig(BaseModel):
    """Validated scheduler configuration (names refer to :data:`REGISTRY` and packing policies)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_sort: str = "drf-aging"
    filters: tuple[str, ...] = ("gpu-type", "residency", "fits-ever", "quota")
    default_policy: str = "cost"
    reserve: str = "gang"
    preempt: str | None = "reclaim"
    packing: str = "frag-aware"
    aging_per_minute: float = Field(1.0, ge=0, description="priority points gained per minute waiting")
    starvation_s: float = Field(1800.0, gt=0, description="a job waiting longer blocks backfill onto its pools")
    preemption_window_s: float = Field(900.0, ge=0, description="a job is preempted at most once per window")
    expected_runtime_h: float = Field(1.0, gt=0, description="runtime assumed for cost when the job gives none")
    max_jobs_per_pass: int = Field(10_000, ge=1)
    burst_after_s: float = Field(0.0, ge=0, description="burst-after-wait: pending time before paid cloud pools")

    @model_validator(mode="after")
    def _names(self) -> SchedulerConfig:
        from gpufleet.scheduler.packing import POLICIES

        _load_builtins()
        checks = [("queue_sort", self.queue_sort), ("score", self.default_policy), ("reserve", self.reserve)]
        checks += [("filter", f) for f in self.filters]
        if self.preempt is not None:
            checks.append(("preempt", self.preempt))
        for kind, name in checks:
            if name not in REGISTRY[kind]:
                raise ValueError(f"unknown {kind} plugin {name!r}; known: {', '.join(sorted(REGISTRY[kind]))}")
        if self.packing not in POLICIES:
            raise ValueError(f"unknown packing policy {self.packing!r}; known: {', '.join(POLICIES)}")
        return self
