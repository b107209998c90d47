"""Progress and heartbeat reporting (the small interface the agent and container share).

Contract:
- :class:`Reporter`: ``progress(step, total)`` after each completed step,
  ``heartbeat()`` periodically, ``event(name, **fields)`` for stage milestones.
- :class:`StreamReporter` writes one JSON object a line to a stream (stdout by
  default): ``{"event": "progress", "step": k, "total": N, "job_id", "epoch"}``,
  ``{"event": "heartbeat", ...}``, ``{"event": "result", "exit_code": ...}``.
  The on-prem agent reads these from the child's stdout.
- :class:`JobItemReporter` writes progress through the fenced job-item update
  (at most every ``min_interval_s``, and always for the last step); each write
  returns the item, so ``cancel_requested`` → CANCELLED, a scheduler's
  ``preempt_requested`` naming this epoch → PREEMPTED (the stage checkpoints at
  once), and a stale epoch → FENCED are raised on the shared :class:`RunControl`.
  This is the one place a worker reads those flags (the agent does not).
- :class:`Heartbeat` calls ``reporter.heartbeat()`` every ``interval_s`` on a
  daemon thread until stopped.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Protocol, TextIO

from gpufleet.clock import Clock
from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch
from gpufleet.runtime.control import RunControl
from gpufleet.store.jobitem import JobItem


class Reporter(Protocol):
    def progress(self, step: int, total: int) -> None: ...

    def heartbeat(self) -> None: ...

    def event(self, name: str, **fields: Any) -> None: ...


class StreamReporter:
    def __init__(self, job_id: str, epoch: int, stream: TextIO | None = None) -> None:
        self.job_id = job_id
        self.epoch = epoch
        self.stream = stream
        self._lock = threading.Lock()

    def _emit(self, body: dict[str, Any]) -> None:
        line = json.dumps({**body, "job_id": self.job_id, "epoch": self.epoch}, default=str)
        out = self.stream or sys.stdout
        with self._lock:
            out.write(line + "\n")
            out.flush()

    def progress(self, step: int, total: int) -> None:
        self._emit({"event": "progress", "step": step, "total": total})

    def heartbeat(self) -> None:
        self._emit({"event": "heartbeat"})

    def event(self, name: str, **fields: Any) -> None:
        self._emit({"event": name, **fields})


def preemption_for(item: dict[str, Any], epoch: int) -> dict[str, Any] | None:
    """The scheduler's ``preempt_requested`` {"epoch", "by", "at"} if it names ``epoch``, else None.

    The attribute stays on the job after that attempt ends, so a request for an
    older epoch must not stop a later attempt.
    """
    req = item.get("preempt_requested")
    if isinstance(req, dict) and int(req.get("epoch", -1)) == int(epoch):
        return req
    return None


#: runtime events that also go to the job's timeline (``GET /v1/jobs/{id}/events``)
TIMELINE_EVENTS = frozenset({"resumed"})


class JobItemReporter:
    def __init__(self, job: JobItem, control: RunControl, min_interval_s: float = 2.0, *, clock: Clock) -> None:
        self.job = job
        self.control = control
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last = float("-inf")
        self._step = (0, 0)

    def _observe(self, fn) -> None:
        try:
            item = fn()
        except StaleEpoch as err:
            self.control.request(ExitCode.FENCED, err.detail)
            return
        if item.get("cancel_requested"):
            self.control.request(ExitCode.CANCELLED, "cancel requested")
            return
        preempt = preemption_for(item, self.job.epoch)
        if preempt is not None:
            self.control.request(ExitCode.PREEMPTED, f"preempted by the scheduler for {preempt.get('by', '?')}")

    def progress(self, step: int, total: int) -> None:
        self._step = (step, total)
        now = self.clock.now()
        if step >= total or now - self._last >= self.min_interval_s:
            self._last = now
            self._observe(lambda: self.job.set_progress(step, total))

    def heartbeat(self) -> None:
        self._observe(self.job.heartbeat)

    def event(self, name: str, **fields: Any) -> None:
        """Events users should see in the job's timeline (:data:`TIMELINE_EVENTS`) are appended to it."""
        if name not in TIMELINE_EVENTS:
            return
        try:
            self.job.add_event(name, fields)
        except StaleEpoch as err:
            self.control.request(ExitCode.FENCED, err.detail)


class MultiReporter:
    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def progress(self, step: int, total: int) -> None:
        for r in self.reporters:
            r.progress(step, total)

    def heartbeat(self) -> None:
        for r in self.reporters:
            r.heartbeat()

    def event(self, name: str, **fields: Any) -> None:
        for r in self.reporters:
            r.event(name, **fields)


class Heartbeat:
    def __init__(self, reporter: Reporter, interval_s: float) -> None:
        self.reporter = reporter
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.reporter.heartbeat()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
