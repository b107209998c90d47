"""Base of the dev stack's background deliveries: while started, one moto method is replaced and a
daemon thread delivers what it collects, as AWS's pollers do after the call that produced it.

Contract of :class:`PatchedDelivery` (a dev-stack component: ``start``/``stop``/``describe``, and a
context manager): :meth:`start` saves ``owner.<attribute>`` (from :meth:`target`), installs
:meth:`patch` of it and starts :meth:`loop` in a daemon thread; :meth:`stop` calls :meth:`wake_to_stop`,
waits for the thread (``stop_wait_s``, 30 s unless set: a delivery still running after it is left to its daemon
thread, as the dev stack does on Ctrl-C, whose process ends right after) and restores the saved method. ``batches``/``errors`` count
deliveries and failed ones. :class:`EventedDelivery` is that base with a ``_wake`` event (set when there is
something to deliver, or to stop) and a ``_stop`` event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class PatchedDelivery:
    name = "delivery"
    thread_name = "delivery"
    #: how long :meth:`stop` waits for a delivery in progress
    stop_wait_s = 30.0

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._original: Any = None
        self.batches = 0
        self.errors = 0

    # -- what a delivery defines ---------------------------------------------------------------
    def target(self) -> tuple[type, str]:
        """(class, method name) to replace while started."""
        raise NotImplementedError

    def patch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The replacement of ``original``."""
        raise NotImplementedError

    def loop(self) -> None:
        """The background thread's body; returns once stopping was asked for."""
        raise NotImplementedError

    def reset(self) -> None:
        """Clear the stop request before the thread starts."""

    def wake_to_stop(self) -> None:
        """Ask :meth:`loop` to return, and wake it."""
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> PatchedDelivery:
        owner, attr = self.target()
        self._original = owner.__dict__[attr]
        setattr(owner, attr, self.patch(self._original))
        self.reset()
        self._thread = threading.Thread(target=self.loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.wake_to_stop()
        if self._thread is not None:
            self._thread.join(self.stop_wait_s)
            self._thread = None
        if self._original is not None:
            owner, attr = self.target()
            setattr(owner, attr, self._original)
            self._original = None

    def __enter__(self) -> PatchedDelivery:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def describe(self) -> dict[str, str]:
        return {}


class EventedDelivery(PatchedDelivery):
    """A :class:`PatchedDelivery` whose loop waits on ``_wake`` and ends once ``_stop`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self._wake = threading.Event()
        self._stop = threading.Event()

    def reset(self) -> None:
        self._stop.clear()

    def wake_to_stop(self) -> None:
        self._stop.set()
        self._wake.set()
