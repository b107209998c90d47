"""Shared, lazily built dependencies of the lifecycle task handlers (one per Lambda container).

:func:`override` replaces collaborators of :class:`~gpufleet.lifecycle.settings.Deps` (for example
the quota release or the prompt check) in the next and all later builds; the local harness and the
e2e suite use it to plug in stand-ins for components that are not deployed there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.lifecycle.settings import Deps

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


@lru_cache(maxsize=1)
def deps() -> Deps:
    built = Deps.from_env()
    for name, value in _overrides.items():
        setattr(built, name, value)
    return built
