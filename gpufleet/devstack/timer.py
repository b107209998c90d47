"""A periodic task on a daemon thread (the scheduler pass timer of the embedded stack).

Contract: ``fn`` runs every ``interval_s`` seconds (measured start to start, never overlapping
itself) until :meth:`stop`; :meth:`kick` runs it as soon as possible. An exception from ``fn``
is logged with its traceback and counted in ``errors``; the timer keeps going (the next pass
retries, as the production schedule would). :meth:`stop` waits for a running ``fn`` at most ``timeout``
seconds; :meth:`join` waits for it again later (the dev stack first makes a pass that is still queued
return, then joins).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gpufleet.devstack.timer")


class Periodic:
    def __init__(self, name: str, fn: Callable[[], object], interval_s: float) -> None:
        self.name = name
        self.fn = fn
        self.interval_s = interval_s
        self.runs = 0
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.fn()
            except Exception as err:  # noqa: BLE001 - logged and counted; the next pass retries
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"
                log.exception("%s failed", self.name)
            self.runs += 1
            self._wake.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
            self._wake.clear()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        self.join(timeout)

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end (at most ``timeout`` s); whether it has."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True
