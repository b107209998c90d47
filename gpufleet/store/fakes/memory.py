"""The shared state of the in-memory fakes: items by table and key, under one lock."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]


@dataclass(frozen=True)
class MemoryWrite:
    """One conditional write that may join another fake store's transaction.

    ``check`` is the condition (evaluated under the database lock), ``apply`` the write, and
    ``error`` the domain error a failed condition raises.
    """

    check: Callable[[], bool]
    apply: Callable[[], None]
    error: Callable[[], Exception]


@dataclass
class MemoryDatabase:
    """Tables of items keyed ``(pk, sk)``; every read returns a copy, every write happens under ``lock``."""

    tables: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def table(self, name: str) -> dict[Key, dict[str, Any]]:
        return self.tables.setdefault(name, {})

    def get(self, table: str, key: Key) -> dict[str, Any] | None:
        with self.lock:
            item = self.table(table).get(key)
            return copy.deepcopy(item) if item is not None else None

    def put(self, table: str, item: dict[str, Any]) -> None:
        with self.lock:
            self.table(table)[(item["pk"], item["sk"])] = copy.deepcopy(item)

    def delete(self, table: str, key: Key) -> None:
        with self.lock:
            self.table(table).pop(key, None)

    def transact(self, writes: Sequence[MemoryWrite]) -> None:
        """All ``writes`` land or none: the first failed condition raises its error."""
        with self.lock:
            for w in writes:
                if not w.check():
                    raise w.error()
            for w in writes:
                w.apply()
