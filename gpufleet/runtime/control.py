"""Run control: why the current stage must stop (preempted, cancelled, fenced).

Contract: :class:`RunControl` is shared by the compute loop and the watcher
threads (signal handler, spot watcher, heartbeat). Requests are sticky and the
first reason wins; the loop polls :meth:`RunControl.stop_reason` between steps.

Signals (:data:`gpufleet.envelope.STOP_SIGNALS`, the agent's): SIGTERM (and SIGINT) → PREEMPTED: checkpoint at
the next step boundary and exit PREEMPTED; SIGUSR1 → CANCELLED and SIGUSR2 → TIMED_OUT (the agent saw the
cancel or the time limit first: stop as they ask, with their exit code). The first stop signal wins.
Repeated SIGTERMs are idempotent — an orphan whose agent was killed
is sent the parent-death signal again each time the kernel re-parents it across the
dying agent's threads, and must still checkpoint once; whoever wants the process gone
at once sends SIGKILL (the agent's hard stop, Batch/ECS after the stop timeout). Only
a second SIGINT (an operator's Ctrl-C at a terminal) exits at once, code PREEMPTED.

One refinement of "first wins": a SIGTERM cannot say why it came — a drain, a spot reclaim, or AWS Batch's
TerminateJob, which the API sends for a cancel — so a PREEMPTED that a signal asked for becomes CANCELLED when the
job item is then seen cancelled (:meth:`RunControl.request` with CANCELLED; ``preempted_by_signal`` tells a stage to
look: :func:`gpufleet.runtime.context.refined_stop`, which the on-prem container stage calls before it chooses its stop
grace, the cloud supervisor once its watch ends, and the generate stage before its stop checkpoint). The container then gets the cancel's short grace, not the
preemption's 30 s, and both report CANCELLED, with "cancel requested (after signal SIGTERM)" in the job's log.
"""

from __future__ import annotations

import os
import signal
import threading

from gpufleet.envelope import STOP_SIGNALS, ExitCode


class RunControl:
    def __init__(self) -> None:
        # re-entrant: a signal handler runs on the main thread, possibly while it is inside request()
        self._lock = threading.RLock()
        self._reason: ExitCode | None = None
        self.detail = ""
        self.stop_event = threading.Event()
        self._signalled = False
        self._by_signal = False  # the reason set was a signal's (its cause unknown: see the module docstring)
        self._sigints = 0

    def request(self, code: ExitCode, detail: str, *, by_signal: bool = False) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = code
                self.detail = detail
                self._by_signal = by_signal
            elif code is ExitCode.CANCELLED and self.preempted_by_signal:
                self._reason = code  # the SIGTERM was the cancel's (module docstring)
                self.detail = f"{detail} (after {self.detail})"
                self._by_signal = False
        self.stop_event.set()

    @property
    def preempted_by_signal(self) -> bool:
        """The stop is a PREEMPTED that a signal asked for (SIGTERM/SIGINT: its cause unknown)."""
        return self._by_signal and self._reason is ExitCode.PREEMPTED

    def stop_reason(self) -> ExitCode | None:
        return self._reason

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT → preempted (checkpoint, then exit), SIGUSR1 → cancelled, SIGUSR2 → timed out; further
        stop signals change nothing; a second SIGINT exits at once (see module docstring)."""
        code_of = {sig: code for code, sig in STOP_SIGNALS.items()} | {signal.SIGINT: ExitCode.PREEMPTED}

        def handler(signum, _frame):
            if signum == signal.SIGINT:
                self._sigints += 1
                if self._sigints > 1:
                    os._exit(int(ExitCode.PREEMPTED))
            if self._signalled:  # set before request(): a handler nested in this one returns here
                return
            self._signalled = True
            self.request(code_of[signal.Signals(signum)], f"signal {signal.Signals(signum).name}", by_signal=True)

        for sig in code_of:
            signal.signal(sig, handler)
