"""The built-in scheduler plugins by name: one explicit table, name → factory, per extension point.

Extension points (``KINDS``): ``queue_sort``, ``scope``, ``filter``, ``score``, ``reserve``,
``preempt`` (the Protocols of :mod:`gpufleet.scheduler.plugins`) and ``packing`` (node-level
:class:`~gpufleet.scheduler.context.PackingPolicy`). The table is written out here; plugin
modules do not register themselves and never import this module. :func:`build` is the one
way to make a plugin from its name; an unknown name is a :class:`~gpufleet.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.errors import ConfigError
from gpufleet.scheduler import gang, ordering, packing, pool_policy, preempt

KINDS = ("queue_sort", "scope", "filter", "score", "reserve", "preempt", "packing")

REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {
    "queue_sort": {
        "fifo": ordering.Fifo,
        "priority": ordering.PriorityFifo,
        "drf": ordering.Drf,
        "drf-aging": ordering.DrfAging,
    },
    "scope": {
        "allowlist": pool_policy.AllowlistScope,
    },
    "filter": {
        "gpu-type": pool_policy.GpuTypeFilter,
        "residency": pool_policy.ResidencyFilter,
        "fits-ever": pool_policy.FitsEverFilter,
        "quota": pool_policy.QuotaFilter,
        "burst-within-guarantee": pool_policy.BurstWithinGuaranteeFilter,
        "burst-after-wait": pool_policy.BurstAfterWaitFilter,
    },
    "score": {
        "cost": pool_policy.CostScore,
        "latency": pool_policy.LatencyScore,
        "locality": pool_policy.LocalityScore,
    },
    "reserve": {
        "gang": gang.GangReserve,
    },
    "preempt": {
        "reclaim": preempt.ReclaimPreempt,
    },
    "packing": {
        p.name: p for p in (packing.RandomFit, packing.DotProduct, packing.GpuPacking, packing.BestFit, packing.FGD, packing.FragAware)
    },
}


def names(kind: str) -> tuple[str, ...]:
    """The built-in names of extension point ``kind``, in registry order."""
    return tuple(REGISTRY[kind])


def unknown(kind: str, name: str) -> str | None:
    """Why ``name`` is not a ``kind`` plugin, or None when it is one."""
    if kind not in REGISTRY:
        return f"unknown extension point {kind!r}; known: {', '.join(KINDS)}"
    if name in REGISTRY[kind]:
        return None
    return f"no {kind} plugin named {name!r}; known: {', '.join(sorted(REGISTRY[kind]))}"


def build(kind: str, name: str, **kwargs: Any) -> Any:
    """A new ``kind`` plugin named ``name`` (``kwargs`` go to its factory)."""
    why = unknown(kind, name)
    if why is not None:
        raise ConfigError(why)
    return REGISTRY[kind][name](**kwargs)
