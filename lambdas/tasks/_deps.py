"""Shared, lazily built dependencies of the lifecycle task handlers (one per Lambda container)."""

from __future__ import annotations

from functools import lru_cache

from gpufleet.lifecycle.settings import Deps


@lru_cache(maxsize=1)
def deps() -> Deps:
    return Deps.from_env()
