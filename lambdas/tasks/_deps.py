"""Shared, lazily built dependencies of the lifecycle task handlers (one per Lambda container): the
settings from the environment, the boto3 clients, the system clock and the quota release are wired
here, once, and nowhere in :mod:`gpufleet.lifecycle`.

:func:`override` replaces collaborators of :class:`~gpufleet.lifecycle.settings.Deps` (for example
the quota release or the prompt check) in the next and all later builds; the local harness and the
e2e suite use it to plug in stand-ins for components that are not deployed there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.clock import Clock, SystemClock
from gpufleet.lifecycle.settings import Deps, LifecycleSettings, Release
from gpufleet.store.clients import client
from gpufleet.tables import TableNames

_overrides: dict[str, Any] = {}


def override(**collaborators: Any) -> None:
    """Set ``Deps`` attributes on every build from now on (and drop the cached one)."""
    unknown = set(collaborators) - set(Deps.__dataclass_fields__)
    if unknown:
        raise TypeError(f"Deps has no {sorted(unknown)}")
    _overrides.update(collaborators)
    deps.cache_clear()


def reset() -> None:
    _overrides.clear()
    deps.cache_clear()


def _release(ddb, names: TableNames, clock: Clock) -> Release:
    """Give an attempt's capacity back (quota usage and allocations, :mod:`gpufleet.store.placements`)."""

    def release(job_id: str, epoch: int) -> bool:
        from gpufleet.store.placements import release as release_attempt  # only terminal/retry steps need it

        return release_attempt(ddb, job_id, epoch, names=names, clock=clock)

    return release


def from_env() -> Deps:
    """The lifecycle's stores and collaborators over boto3 clients, from the Lambda's environment
    (:class:`LifecycleSettings`, loaded here once per container)."""
    settings = LifecycleSettings.load()
    ddb = client("dynamodb")
    clock = SystemClock()
    return Deps.build(
        ddb, settings=settings, clock=clock, s3=client("s3"), sqs=client("sqs"), events=client("events"),
        release=_release(ddb, settings.tables, clock),
    )


@lru_cache(maxsize=1)
def deps() -> Deps:
    built = from_env()
    for name, value in _overrides.items():
        setattr(built, name, value)
    return built
