"""Models kept loaded in a warm worker between jobs, and which to evict (the decision is pure).

Contract:
- A *resident* model is a loaded pipeline identified by :class:`ModelKey` — the model name the spec
  uses, its content hash and the device — with its size in bytes (the model folder's size on disk: the
  float32 weights it loads) and the sequence number of its last use.
- :func:`plan_evictions` (pure) decides, before a model is loaded, which residents to drop so that the
  wanted model fits ``budget_bytes`` together with those kept: least recently used first. The wanted
  model itself is always admitted (a budget smaller than one model keeps exactly the last one, which is
  the default: ``budget_bytes`` 0). A resident with the wanted name but another hash or device is
  always evicted (a republished model must not be served from memory).
- :class:`ResidentModels` holds the pipelines of one worker process. :meth:`ResidentModels.pipeline`
  returns ``(pipe, was_resident)``; only a warm worker creates one (:mod:`gpufleet.runtime.worker`);
  a fresh ``python -m gpufleet.runtime`` has none and loads its model every time.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, order=True)
class ModelKey:
    name: str
    content_hash: str
    device: str


@dataclass(frozen=True)
class Resident:
    key: ModelKey
    size_bytes: int
    last_used: int  # a sequence number: larger is more recent


def plan_evictions(resident: tuple[Resident, ...], wanted: ModelKey, wanted_bytes: int,
                   budget_bytes: int) -> tuple[ModelKey, ...]:
    """The residents to evict before ``wanted`` is used, least recently used first (see module contract)."""
    if any(r.key == wanted for r in resident):
        return ()  # already loaded: nothing to make room for
    others = list(resident)
    total = wanted_bytes + sum(r.size_bytes for r in others)
    evict: list[ModelKey] = []
    stale = [r for r in others if r.key.name == wanted.name]
    for r in stale:
        evict.append(r.key)
        total -= r.size_bytes
    for r in sorted((r for r in others if r.key.name != wanted.name), key=lambda r: (r.last_used, r.key)):
        if total <= budget_bytes:
            break
        evict.append(r.key)
        total -= r.size_bytes
    return tuple(evict)


def folder_bytes(path: Path) -> int:
    """The size of a model folder on disk (its weights dominate)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class ResidentModels:
    """The loaded pipelines of one warm worker (see module contract)."""

    def __init__(self, budget_bytes: int = 0) -> None:
        self.budget_bytes = budget_bytes
        self._pipes: dict[ModelKey, Any] = {}
        self._meta: dict[ModelKey, Resident] = {}
        self._seq = 0
        self._lock = threading.RLock()  # the members of a batch resolve their pipeline from threads

    def names(self) -> list[str]:
        """The model names resident now (what the agent advertises)."""
        return sorted({k.name for k in self._pipes})

    def holds(self, key: ModelKey) -> bool:
        return key in self._pipes

    def pipeline(self, key: ModelKey, path: Path, load: Callable[[], Any]) -> tuple[Any, bool]:
        """The pipeline for ``key``: the resident one, or ``load()`` after evicting per :func:`plan_evictions`
        (one caller at a time: the members of a batch load the model once)."""
        with self._lock:
            return self._pipeline(key, path, load)

    def _pipeline(self, key: ModelKey, path: Path, load: Callable[[], Any]) -> tuple[Any, bool]:
        self._seq += 1
        if key in self._pipes:
            self._meta[key] = Resident(key, self._meta[key].size_bytes, self._seq)
            return self._pipes[key], True
        size = folder_bytes(path)
        for k in plan_evictions(tuple(self._meta.values()), key, size, self.budget_bytes):
            self._pipes.pop(k, None)
            self._meta.pop(k, None)
        _release_memory()
        pipe = load()
        self._pipes[key] = pipe
        self._meta[key] = Resident(key, size, self._seq)
        return pipe, False


def _release_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        pass


#: set by a warm worker at start-up (:mod:`gpufleet.runtime.worker`); None in a one-job process
RESIDENT: ResidentModels | None = None
