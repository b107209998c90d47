"""Injectable clocks. Pass a clock explicitly; never read time inside pure logic."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class WaitingClock(Clock, Protocol):
    """A clock for long-running loops: wall time, a monotonic reading for deadlines, and waiting.

    ``wait`` blocks until ``event`` is set or ``timeout`` seconds pass and returns whether it is set
    (``threading.Event.wait``); a fake clock advances its time instead of blocking.
    """

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, timeout: float) -> bool: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)


class FakeClock:
    """A manual clock for tests and the simulator."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if not event.is_set():
            self.advance(timeout)
        return event.is_set()


def iso(ts: float) -> str:
    """RFC 3339 UTC timestamp with milliseconds (sortable as a string)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def epoch_seconds(value: Any) -> float | None:
    """``value`` as epoch seconds: a number as it is, an RFC 3339 string (as :func:`iso` writes) parsed; None when it
    is neither (absent, another type, an unreadable string)."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
