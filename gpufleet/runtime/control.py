"""Run control: why the current stage must stop (preempted, cancelled, fenced).

Contract: :class:`RunControl` is shared by the compute loop and the watcher
threads (signal handler, spot watcher, heartbeat). Requests are sticky and the
first reason wins; the loop polls :meth:`RunControl.stop_reason` between steps.
A second SIGTERM exits the process at once (code PREEMPTED).
"""

from __future__ import annotations

import os
import signal
import threading

from gpufleet.envelope import ExitCode


class RunControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: ExitCode | None = None
        self.detail = ""
        self.stop_event = threading.Event()
        self._sigterms = 0

    def request(self, code: ExitCode, detail: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = code
                self.detail = detail
        self.stop_event.set()

    def stop_reason(self) -> ExitCode | None:
        return self._reason

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT → preempted (checkpoint now); a second SIGTERM exits at once."""

        def handler(signum, _frame):
            self._sigterms += 1
            if self._sigterms > 1:
                os._exit(int(ExitCode.PREEMPTED))
            self.request(ExitCode.PREEMPTED, f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
