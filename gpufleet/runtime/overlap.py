"""A control-plane write that overlaps compute: one call on its own thread, settled once (pure threading).

Contract: :class:`Overlapped` starts ``call`` at once on a daemon thread. :meth:`Overlapped.result` waits
for it and returns its value or re-raises its error (a ``StaleEpoch`` from a fenced write stays a
``StaleEpoch``); later calls return the same value or raise the same error again. :meth:`Overlapped.wait`
only waits, keeping any error for :meth:`result` (the path out of a crash, where the stage's own error
is the one to report).

The generate stage uses it for its ``SCHEDULED → RUNNING`` write (a node API round trip, ~0.1 s): the
first denoising step runs while the write is in flight, and the write is settled before anything else of
the attempt is written (progress, checkpoints, the output), so the item's order of writes is unchanged —
only the GPU starts earlier. A fenced attempt therefore runs at most one step before it stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Overlapped(Generic[T]):
    def __init__(self, call: Callable[[], T], name: str = "overlapped") -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as err:  # noqa: BLE001 - handed to the caller by result()
            self._error = err

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
