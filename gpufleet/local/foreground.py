"""Foreground before background in the embedded stack's one process.

Why: the dev stack runs the API (behind the local gateway), moto, and every background function (the stream
and outbox consumers, the workflow executions and their task Lambdas, the scheduler pass) in one Python
process: one interpreter lock on the cores it gets. Under a burst of submissions the background work they
cause (a workflow start, a CheckPrompt and a scheduler pass per job) competes with each API request for the
interpreter, and the request latency grows with the backlog. Here a request goes first: background work
waits at its next step while a request is being answered.

Contract of :class:`ForegroundGate`:

- :meth:`ForegroundGate.foreground` is a foreground section (the gateway opens one per request, from its
  arrival to its answer); sections may overlap and nest (they are counted). Inside one, on that thread,
  :meth:`ForegroundGate.is_foreground` is true.
- :meth:`ForegroundGate.background_turn` is called by background work before each step (a Lambda
  invocation, a moto request that is not foreground): it returns at once when no foreground section is
  open (or the gate is closed), else it waits until none is, or until ``max_wait_s`` has passed, so
  background work is delayed but never starved (while the foreground stays busy, each waiting step
  proceeds after ``max_wait_s``). Returns the seconds waited; ``waits``/``waited_s`` count them.
- The moto server cannot see which thread sent a request: a boto3 client marked with :func:`tag_client`
  sends every request with the header :data:`HEADER` ``: foreground``, and the moto server thread serving it
  runs it as foreground (:func:`gpufleet.local.moto_patches.patch_foreground_gate`).
- :meth:`ForegroundGate.hold` / :meth:`ForegroundGate.release` open and close a section that belongs to no thread
  here: a request another process is answering (the dev stack's API process,
  :mod:`gpufleet.devstack.api_process`, reports each of its sections; when it dies, those still open are released).
- :meth:`ForegroundGate.close` (the stack is stopping) lets every waiting and later background step through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the request header that marks a moto request as foreground (value :data:`FOREGROUND`)
HEADER = "x-gpufleet-lane"
FOREGROUND = "foreground"
#: ``environ`` key of :data:`HEADER` in the moto server's WSGI application
ENVIRON_KEY = "HTTP_" + HEADER.upper().replace("-", "_")


class ForegroundGate:
    def __init__(self, max_wait_s: float = 1.0) -> None:
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._open = 0
        self._closed = False
        self._local = threading.local()
        self.waits = 0
        self.waited_s = 0.0

    @contextmanager
    def foreground(self) -> Iterator[None]:
        local = self._local
        self.hold()
        local.depth = getattr(local, "depth", 0) + 1
        try:
            yield
        finally:
            local.depth -= 1
            self.release()

    def hold(self) -> None:
        """Open a foreground section that belongs to no thread of this process (close it with :meth:`release`)."""
        with self._cond:
            self._open += 1

    def release(self, sections: int = 1) -> None:
        """Close ``sections`` sections opened by :meth:`hold` (never below none open)."""
        with self._cond:
            self._open = max(0, self._open - sections)
            if self._open == 0:
                self._cond.notify_all()

    def is_foreground(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @property
    def busy(self) -> bool:
        """Whether a foreground section is open."""
        return self._open > 0

    def background_turn(self, max_wait_s: float | None = None) -> float:
        if self._open == 0 or self._closed or self.is_foreground():
            return 0.0
        limit = self.max_wait_s if max_wait_s is None else max_wait_s
        t0 = time.monotonic()
        with self._cond:
            self._cond.wait_for(lambda: self._open == 0 or self._closed, limit)
        waited = time.monotonic() - t0
        self.waits += 1
        self.waited_s += waited
        return waited

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def tag_client(client: Any) -> Any:
    """Mark every request of a boto3 ``client`` as foreground (see the module contract); returns the client."""

    def add_header(request: Any, **_: Any) -> None:
        request.headers[HEADER] = FOREGROUND

    client.meta.events.register("before-send.*", add_header)
    return client
