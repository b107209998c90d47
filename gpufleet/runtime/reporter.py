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
  With ``background`` (the runtime's), ``progress`` only hands the step to a writer thread and returns: the compute
  loop never waits on a round trip (a node API call is ~50 ms; the GPU would idle through it). The writer sends the
  latest step handed to it (steps handed while a write is in flight fold into one write) and raises on the
  :class:`RunControl` as above; an error other than a stale epoch (the node API unreachable, after its retries) is
  raised by the next ``progress`` or by :meth:`JobItemReporter.flush`, as the write itself would have raised it.
  :meth:`JobItemReporter.flush` waits until every handed step is written (the stage calls it before writing its
  output, the runtime before its result); :meth:`JobItemReporter.close` flushes, never raises, and stops the thread.
- :class:`Heartbeat` calls ``reporter.heartbeat()`` every ``interval_s`` on a
  daemon thread until stopped.
"""

from __future__ import annotations

import functools
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

    def flush(self) -> None:
        """Return once every progress report handed over is written (a reporter that writes at once: at once)."""


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

    def flush(self) -> None:  # each line is written and flushed when it is emitted
        return None


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
    def __init__(self, job: JobItem, control: RunControl, min_interval_s: float = 2.0, *, clock: Clock,
                 background: bool = False) -> None:
        self.job = job
        self.control = control
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.background = background
        self._last = float("-inf")
        self._step = (0, 0)
        self._cond = threading.Condition()
        self._handed: tuple[int, int] | None = None  # the latest step handed to the writer, not yet taken
        self._writing = False
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

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
            # never the job it makes room for: that may be another tenant's, and this detail reaches the job's logs
            self.control.request(ExitCode.PREEMPTED, "preempted by the scheduler (its GPUs go to a higher-priority job)")

    def progress(self, step: int, total: int) -> None:
        self._step = (step, total)
        self._raise_error()
        now = self.clock.now()
        if step >= total or now - self._last >= self.min_interval_s:
            self._last = now
            if not self.background:
                self._observe(lambda: self.job.set_progress(step, total))
                return
            with self._cond:
                self._handed = (step, total)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._write_handed, name="progress-writer", daemon=True)
                    self._thread.start()
                self._cond.notify_all()

    def _write_handed(self) -> None:
        while True:
            with self._cond:
                while self._handed is None and not self._closed:
                    self._cond.wait()
                if self._handed is None:
                    return
                handed, self._handed, self._writing = self._handed, None, True
            try:
                self._observe(functools.partial(self.job.set_progress, *handed))
            except Exception as err:  # noqa: BLE001 - handed to the stage by the next progress() or flush()
                with self._cond:
                    self._error = self._error or err
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _raise_error(self) -> None:
        with self._cond:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def flush(self) -> None:
        """Wait until every step handed to the writer is written; raise a write's error (see the contract)."""
        with self._cond:
            while self._handed is not None or self._writing:
                self._cond.wait()
        self._raise_error()

    def close(self) -> None:
        """Flush, never raise, and end the writer thread."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001, S110 - closing after the stage's result: the error no longer matters
            pass
        with self._cond:
            self._closed = True
            self._cond.notify_all()

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

    def flush(self) -> None:
        """Flush the reporters that write in the background (:meth:`JobItemReporter.flush`)."""
        for r in self.reporters:
            r.flush()

    def close(self) -> None:
        for r in self.reporters:
            if hasattr(r, "close"):
                r.close()


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
