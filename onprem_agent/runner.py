"""One job on the node: pre-flight checks, the child process, heartbeats, and the report.

Contract (see docs/agent.md, "Job lifecycle on a node"):
1. Before spawning, the attempt is heartbeaten through the node API (the server checks it is
   this node's at the current epoch and keeps the task token): a message whose epoch is older
   than the job's ``current_epoch`` is dropped (the server refuses it: 409), a cancelled job
   is reported CANCELLED without running, and a task the workflow no longer waits on (410) or
   that is not this node's (403) is dropped. None of these run anything.
2. The child runs in its own process group: a fresh ``runtime_command`` process, or with warm workers on
   (``ports.warm``) a ``generate`` envelope goes to its GPU set's long-lived worker
   (:mod:`onprem_agent.warm`), driven through the same interface; everything below applies to both. Every ``heartbeat_interval_s`` the
   runner extends the SQS visibility and heartbeats the attempt through the node API, which
   answers the job's view: ``cancel_requested`` → the cancel's signal to the group (SIGUSR1,
   :data:`gpufleet.envelope.STOP_SIGNALS`: the runtime stops as a cancel and exits CANCELLED itself), SIGKILL
   after ``cancel_grace_s`` → CANCELLED; a newer epoch (409) → SIGKILL → FENCED; the task
   gone → SIGKILL, nothing reported (the workflow already moved on). A job whose spec sets
   ``max_run_seconds`` and runs past it (from its spawn) is stopped the same way as a cancel (SIGUSR2,
   SIGKILL after ``cancel_grace_s``) and reported TIMED_OUT, whatever the child exited with.
3. On drain the group gets SIGTERM (the runtime checkpoints and exits
   PREEMPTED); heartbeats continue meanwhile; after the drain deadline, SIGKILL. A cancel or the time
   limit during a drain is signalled too, and its shorter grace applies from then.
   A gang member (``env.gang``) waits at the start barrier first: it keeps heartbeating (which tells
   the server it is ready) until the view says ``released`` — every member is ready — and only then
   spawns. If the barrier times out, a member fails or goes silent, the server fails the attempt and
   answers 410: the member stops (or never starts) and reports nothing; the gang is retried as a unit.
   A member whose process fails by itself holds its report for ``gang_failure_hold_s``, heartbeating: its
   failure may be a peer's loss (a collective on a dead connection), which the server sees only once the
   lost member has been silent for its ``gang_silence_s``; a 410 meanwhile and nothing is reported.
   Jobs the agent dispatched as one batch (:class:`onprem_agent.warm.BatchLaunch`) meet after their
   pre-flight checks and go to the worker together; each runner then drives its own member exactly as
   above (heartbeats, cancel, fencing, drain, time limit, report), its stops reaching only its member, and
   reports the member's share of the batch's GPU time.
4. After the leader exits, leftover group members are killed; the outcome is
   reported, then recorded as completed locally, then the message is deleted.

A runner sees the agent only through :class:`RunnerPorts`, built once by the
agent: the queue and node API (attempt reports) adapters, the local records, metrics, the
clock, the settings values a job needs, and callbacks for "started", "finished"
(which releases the job's GPUs) and "is the agent draining". Tests drive a runner
with fake ports, a fake child and :class:`gpufleet.clock.FakeClock`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufleet import tracing
from gpufleet.clock import WaitingClock
from gpufleet.envelope import STOP_SIGNALS, Envelope, ExitCode
from gpufleet.errors import NotAllowed, StaleEpoch, TransientError
from gpufleet.gang import dist_env
from onprem_agent.aws import JobView, Message, TaskGone
from onprem_agent.child import Child, child_environment, spawn
from onprem_agent.logs import job_logger
from onprem_agent.metrics import AgentMetrics
from onprem_agent.outcome import Report, Stop, build_report
from onprem_agent.settings import AgentSettings
from onprem_agent.slots import Request
from onprem_agent.warm import BatchLaunch, WorkerPool, serves

_REPORT_ATTEMPTS = 5


def request_for(env: Envelope) -> Request:
    """The GPU request of an envelope on this node: the GPUs its placement names (``gpu_milli`` is per GPU,
    so ``gpus: 2`` placed on ``[1, 3]`` is 2000 milli on exactly those two), else the spec's per-node share."""
    p = env.placement
    indices = tuple(p.gpu_indices) if p is not None else ()
    if p is not None and indices:
        return Request(indices=indices, milli=p.gpu_milli * len(indices))
    if env.spec is not None:
        return Request(milli=env.spec.resources.gpu_milli)
    return Request(milli=p.gpu_milli if p is not None else 1000)


#: the stops the agent signals its child for (the signal: :data:`gpufleet.envelope.STOP_SIGNALS` of this code)
_SIGNALLED_STOPS = {Stop.DRAINED: ExitCode.PREEMPTED, Stop.CANCELLED: ExitCode.CANCELLED,
                    Stop.TIMED_OUT: ExitCode.TIMED_OUT}


@dataclass
class Lease:
    """The SQS message a job came in, with its latest receipt handle (redeliveries refresh it)."""

    message: Message
    receipt: str


class JobQueue(Protocol):
    """The node queue as a runner uses it (:class:`onprem_agent.aws.NodeQueue`)."""

    def extend(self, receipt: str, seconds: int) -> bool: ...

    def release(self, receipt: str) -> bool: ...

    def delete(self, receipt: str) -> None: ...


class Reports(Protocol):
    """The node API calls about an attempt (:class:`onprem_agent.aws.AttemptReports`). The server checks
    that the attempt is this node's at the current epoch; refusals raise TaskGone (the workflow no longer
    waits), StaleEpoch (a newer attempt owns the job) or NotAllowed (not this node's attempt)."""

    def heartbeat(self, job_id: str, epoch: int) -> JobView: ...

    def succeed(self, job_id: str, epoch: int, gpu_seconds: float) -> None: ...

    def fail(self, job_id: str, epoch: int, error: str, detail: str) -> None: ...


class Records(Protocol):
    """The local records of :class:`onprem_agent.state.StateDir` that a runner writes."""

    def envelope_path(self, job_id: str, epoch: int) -> Path: ...

    def log_path(self, job_id: str, epoch: int) -> Path: ...

    def record_running(self, job_id: str, epoch: int, pid: int, now: float) -> Any: ...

    def clear_running(self, job_id: str, epoch: int) -> None: ...

    def record_completed(self, job_id: str, epoch: int, outcome: str, now: float) -> None: ...


@dataclass(frozen=True)
class RunnerSettings:
    """The settings values a job needs (taken once from :class:`AgentSettings`)."""

    node_id: str
    runtime_command: tuple[str, ...]
    work_dir: Path  # the child's working directory (the state dir)
    cache_dir: Path
    heartbeat_interval_s: float
    visibility_timeout_s: int
    cancel_grace_s: float
    drain_timeout_s: float
    orphan_signal: int | None = signal.SIGTERM
    gang_failure_hold_s: float = 0.0

    @classmethod
    def of(cls, s: AgentSettings) -> RunnerSettings:
        return cls(
            node_id=s.node_id, runtime_command=tuple(s.runtime_command), work_dir=s.state_dir, cache_dir=s.cache_dir,
            heartbeat_interval_s=s.heartbeat_interval_s, visibility_timeout_s=s.visibility_timeout_s,
            cancel_grace_s=s.cancel_grace_s, drain_timeout_s=s.drain_timeout_s,
            orphan_signal=getattr(signal, s.orphan_signal) if s.orphan_signal else None,
            gang_failure_hold_s=s.gang_failure_hold_s,
        )


@dataclass(frozen=True)
class RunnerPorts:
    """Everything a :class:`JobRunner` may touch; the agent builds one and shares it."""

    settings: RunnerSettings
    queue: JobQueue
    reports: Reports
    records: Records
    metrics: AgentMetrics
    clock: WaitingClock
    base_env: Mapping[str, str]  # the agent's process environment (agent settings are filtered out)
    extra_env: Mapping[str, str]  # what the agent adds for every job (region, tables, node id, site child_env)
    real_gpus: bool  # whether slot indices are CUDA device indices (False on a CPU-only node)
    draining: Callable[[], bool]
    started: Callable[[JobRunner, float], None]  # the child is running (metrics)
    finished: Callable[[JobRunner], None]  # the runner is done: release its GPUs (if not yet), dispatch more
    # the child is gone: its GPUs may take the next job while the outcome is still being reported
    gpus_free: Callable[[JobRunner], None] = lambda runner: None
    spawn: Callable[..., Child] = spawn
    warm: WorkerPool | None = None  # warm workers (``warm_workers``): the envelopes :func:`serves` picks run there
    logger: Callable[..., logging.LoggerAdapter] = job_logger  # (job_id, epoch, trace_id)


class JobRunner(threading.Thread):
    def __init__(self, ports: RunnerPorts, env: Envelope, lease: Lease, gpus: list[int], req: Request,
                 batch: BatchLaunch | None = None, settle_only: bool = False) -> None:
        super().__init__(name=f"job-{env.job_id}@{env.epoch}", daemon=True)
        self.batch = batch  # the jobs dispatched with this one as a denoising batch (warm workers), if any
        # a held message seen cancelled: only the pre-flight check runs (it reports CANCELLED); a job it would start
        # goes back to the queue instead (it holds no GPUs)
        self.settle_only = settle_only
        self.ports = ports
        self.clock = ports.clock
        self.env = env
        self.lease = lease
        self.gpus = gpus
        self.req = req
        self.log = ports.logger(env.job_id, env.epoch, tracing.trace_id(env.traceparent))
        self.stop_reason = Stop.NONE
        self.child: Child | None = None
        self.report: Report | None = None
        self._drain_at: float | None = None
        self._kill_at: float | None = None
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._beat_now = False  # check_now() asked for a heartbeat before the next one is due

    @property
    def key(self) -> tuple[str, int]:
        return (self.env.job_id, self.env.epoch)

    @property
    def member_id(self) -> str:
        return f"{self.env.job_id}@{self.env.epoch}"

    # control from the agent ----------------------------------------------------------------
    def request_drain(self) -> None:
        with self._lock:
            if self._drain_at is None:
                self._drain_at = self.clock.monotonic()
        self._wake.set()

    def check_now(self) -> None:
        """Heartbeat the attempt at once (a cancel nudge from the node's signal queue): the node API's answer, not the
        nudge, decides whether the job stops."""
        with self._lock:
            self._beat_now = True
        self._wake.set()

    def kill_now(self) -> None:
        """Hard stop (second SIGTERM, drain deadline): SIGKILL the group."""
        child = self.child
        if child is not None:
            child.signal(signal.SIGKILL)
        self._wake.set()

    # the thread ----------------------------------------------------------------------------
    def run(self) -> None:
        p = self.ports
        try:
            if self._preflight():
                if self.settle_only:
                    p.queue.release(self.lease.receipt)
                else:
                    self._execute()
        except TransientError as err:
            # AWS was unreachable before anything ran: leave the message for a later retry.
            self.log.warning("pre-flight check failed; message will be retried", extra={"detail": str(err)})
            p.queue.extend(self.lease.receipt, min(30, p.settings.visibility_timeout_s))
        except Exception:
            # A bug in the agent must not leave the slot held or the agent down: log, report, move on.
            self.log.exception("job runner failed")
            if self.child is not None and self.child.group_alive():
                self.child.kill()
            self._settle(self._unrun_report(ExitCode.SYSTEM_ERROR, Stop.NONE, "agent error while running the job"))
        finally:
            if self.batch is not None:
                self.batch.withdraw(self.member_id)  # not run: the batch starts without it (no-op if it joined)
            p.finished(self)

    def _preflight(self) -> bool:
        """True if the job should start. Otherwise the message is settled (or released) and nothing runs."""
        p, env = self.ports, self.env
        if p.draining():
            p.queue.release(self.lease.receipt)
            return False
        try:
            view = p.reports.heartbeat(env.job_id, env.epoch)
        except StaleEpoch as err:
            self.log.warning("stale message dropped", extra={"current_epoch": err.extra.get("current_epoch")})
            p.metrics.duplicates.labels("stale_epoch").inc()
            self.stop_reason = Stop.FENCED
            self._settle(None, count=False)
            return False
        except (TaskGone, NotAllowed) as err:
            self.log.warning("task token no longer valid; not running", extra={"detail": err.detail})
            p.metrics.duplicates.labels("task_gone").inc()
            self.stop_reason = Stop.ABANDONED
            self._settle(None, count=False)
            return False
        if view.cancel_requested:
            self.stop_reason = Stop.CANCELLED
            self._settle(self._unrun_report(ExitCode.CANCELLED, Stop.CANCELLED, "cancelled before start"))
            return False
        if p.draining():  # a drain began while we checked: do not start a job only to stop it
            p.queue.release(self.lease.receipt)
            return False
        if env.gang is not None and not view.gang_released:
            return self._barrier()
        return True

    def _barrier(self) -> bool:
        """Hold a gang member until every member is ready (True) or the gang is released by the server (False)."""
        p, env = self.ports, self.env
        self.log.info("waiting at the gang barrier", extra={"rank": env.gang.rank, "world_size": env.gang.world_size})
        while True:
            self.clock.wait(self._wake, p.settings.heartbeat_interval_s)
            self._wake.clear()
            if p.draining():
                p.queue.release(self.lease.receipt)
                return False
            p.queue.extend(self.lease.receipt, p.settings.visibility_timeout_s)
            try:
                view = p.reports.heartbeat(env.job_id, env.epoch)
            except (StaleEpoch, TaskGone, NotAllowed) as err:
                self.log.warning("gang released before start; not running", extra={"detail": str(err)})
                self.stop_reason = Stop.ABANDONED
                self._settle(None, count=False)
                return False
            except TransientError as err:
                self.log.warning("heartbeat at the gang barrier failed", extra={"detail": str(err)})
                continue
            if view.cancel_requested:
                self.stop_reason = Stop.CANCELLED
                self._settle(self._unrun_report(ExitCode.CANCELLED, Stop.CANCELLED, "cancelled before start"))
                return False
            if view.gang_released:
                self.log.info("gang barrier released")
                return True

    def _unrun_report(self, code: ExitCode, stop: Stop, detail: str) -> Report:
        """The report of an attempt that used no GPU time (refused before start, or the agent failed)."""
        return build_report(code.value, stop, epoch=self.env.epoch, node=self.ports.settings.node_id,
                            gpu_seconds=0.0, detail=detail)

    def _execute(self) -> None:
        p, env = self.ports, self.env
        envelope_file = p.records.envelope_path(env.job_id, env.epoch)
        fd = os.open(envelope_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(env.model_dump_json())
        cfg = p.settings
        child_env = child_environment(
            p.base_env, p.extra_env, self.gpus, p.real_gpus, cfg.cache_dir, env.job_id, env.epoch, dist_env(env.gang)
        )
        log_path = p.records.log_path(env.job_id, env.epoch)
        warm = p.warm is not None and serves(env)
        argv = ["--envelope-file", str(envelope_file)]
        if warm and self.batch is not None:
            self.child = self.batch.join(self.member_id, argv, child_env, log_path, lambda: self.stop_reason.value)
        elif warm:
            self.child = p.warm.run(tuple(self.gpus), argv, child_env, log_path)
            self.child.notify_on_reply(self._wake.set)  # its done reply ends the wait below at once
        else:
            self.child = p.spawn(list(cfg.runtime_command), envelope_file, child_env, log_path, cfg.work_dir,
                                 clock=self.clock, orphan_signal=cfg.orphan_signal)
        p.metrics.starts.labels("warm" if warm else "fresh").inc()
        started = self.clock.now()
        p.records.record_running(env.job_id, env.epoch, self.child.pid, started)
        p.started(self, started)
        self.log.info("job started", extra={"pid": self.child.pid, "gpus": self.gpus, "warm": warm})

        interval = cfg.heartbeat_interval_s
        next_beat = self.clock.monotonic() + interval
        limit = env.spec.max_run_seconds if env.spec is not None else None
        time_up = self.clock.monotonic() + limit if limit else None
        signalled: Stop | None = None  # the stop the child was last signalled for
        while True:
            rc = self.child.poll()
            if rc is not None:
                break
            now = self.clock.monotonic()
            with self._lock:
                beat_now, self._beat_now = self._beat_now, False
            if now >= next_beat or beat_now:
                self._beat()
                next_beat = now + interval
            with self._lock:
                drain_at = self._drain_at
            if drain_at is not None and self.stop_reason is Stop.NONE:
                self.stop_reason = Stop.DRAINED
            if time_up is not None and now >= time_up and self.stop_reason in (Stop.NONE, Stop.DRAINED):
                self.log.info("maximum run time exceeded; stopping the job", extra={"max_run_seconds": limit})
                self.stop_reason = Stop.TIMED_OUT
            # each stop its own signal (STOP_SIGNALS), once; a cancel or the time limit during a drain is signalled
            # too, and its (shorter) grace applies from then: a later stop never extends the deadline
            if self.stop_reason in _SIGNALLED_STOPS and self.stop_reason is not signalled:
                self.child.signal(STOP_SIGNALS[_SIGNALLED_STOPS[self.stop_reason]])
                signalled = self.stop_reason
                grace = cfg.drain_timeout_s if self.stop_reason is Stop.DRAINED else cfg.cancel_grace_s
                self._kill_at = now + grace if self._kill_at is None else min(self._kill_at, now + grace)
            if self.stop_reason in (Stop.FENCED, Stop.ABANDONED) or (self._kill_at is not None and now >= self._kill_at):
                self.child.signal(signal.SIGKILL)
            self.clock.wait(self._wake, 0.05)
            self._wake.clear()
        ended = self.clock.now()
        if self.child.group_alive():
            self.child.kill()  # grandchildren the job left behind
        p.gpus_free(self)  # nothing of the job runs any more: the next job starts while this one reports
        p.records.clear_running(env.job_id, env.epoch)
        envelope_file.unlink(missing_ok=True)
        run_s = ended - started
        p.metrics.run_time.observe(run_s)
        # a batch member's GPU time is its part of the batch's (the worker splits it), else its run time
        shared = getattr(self.child, "gpu_seconds", None)
        report = build_report(  # the server adds the job's generated pointer to a success
            rc, self.stop_reason, epoch=env.epoch, node=p.settings.node_id,
            gpu_seconds=(run_s if shared is None else shared) * self.req.milli / 1000.0,
            detail=f"maximum run time of {limit} s exceeded" if self.stop_reason is Stop.TIMED_OUT else "",
        )
        self.log.info("job ended", extra={"returncode": rc, "outcome": report.outcome, "stop": self.stop_reason.value,
                                         "run_s": round(run_s, 3)})
        if env.gang is not None and not report.success and self.stop_reason is Stop.NONE:
            self._hold_gang_failure()
        self._settle(None if self.stop_reason is Stop.ABANDONED else report)

    def _hold_gang_failure(self) -> None:
        """A gang member's process failed by itself — maybe because a peer vanished (a collective on a dead
        connection). Keep heartbeating for ``gang_failure_hold_s``: if the gang fails meanwhile (410: the node
        API saw a silent member and failed the gang as a system error), the stop becomes ABANDONED and this
        member reports nothing; otherwise its failure is reported after the hold."""
        hold = self.ports.settings.gang_failure_hold_s
        if hold <= 0:
            return
        self.log.info("gang member failed; holding its report while the other members are checked",
                      extra={"hold_s": hold})
        deadline = self.clock.monotonic() + hold
        while self.clock.monotonic() < deadline:
            self._beat()
            if self.stop_reason is not Stop.NONE:  # ABANDONED (the gang failed elsewhere) or FENCED
                self.log.info("the gang ended elsewhere while this member's failure was held; not reported",
                              extra={"stop": self.stop_reason.value})
                return
            self.clock.sleep(min(self.ports.settings.heartbeat_interval_s, max(0.0, deadline - self.clock.monotonic())))

    def _beat(self) -> None:
        p, env = self.ports, self.env
        p.queue.extend(self.lease.receipt, p.settings.visibility_timeout_s)
        try:
            view = p.reports.heartbeat(env.job_id, env.epoch)
        except StaleEpoch as err:
            self.log.warning("fenced off by a newer attempt", extra={"current_epoch": err.extra.get("current_epoch")})
            self.stop_reason = Stop.FENCED
            return
        except (TaskGone, NotAllowed):
            self.log.warning("task gone while running; stopping the job")
            self.stop_reason = Stop.ABANDONED
            return
        except TransientError as err:
            p.metrics.heartbeat_errors.labels("task").inc()
            self.log.warning("task heartbeat failed", extra={"detail": str(err)})
            return
        if view.current_epoch != env.epoch:
            self.log.warning("fenced off by a newer attempt", extra={"current_epoch": view.current_epoch})
            self.stop_reason = Stop.FENCED
        elif view.cancel_requested and self.stop_reason in (Stop.NONE, Stop.DRAINED):
            self.log.info("cancel requested")
            self.stop_reason = Stop.CANCELLED

    def _send(self, report: Report) -> None:
        env = self.env
        delay = 0.2
        for attempt in range(_REPORT_ATTEMPTS):
            try:
                if report.success:
                    self.ports.reports.succeed(env.job_id, env.epoch, float((report.output or {}).get("gpu_seconds", 0)))
                else:
                    self.ports.reports.fail(env.job_id, env.epoch, str(report.error),
                                            str((report.cause or {}).get("detail", "")))
                return
            except (TaskGone, StaleEpoch, NotAllowed) as err:
                self.log.warning("outcome not accepted: the attempt is no longer this node's to report",
                                 extra={"detail": err.detail})
                return
            except TransientError as err:
                self.log.warning("report failed, retrying", extra={"attempt": attempt + 1, "detail": str(err)})
                self.clock.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.log.error("could not report the outcome; the workflow's heartbeat timeout will retry the job")

    def _settle(self, report: Report | None, count: bool = True) -> None:
        """Report (if any), record (job, epoch) as completed, delete the message — in that order."""
        p, env = self.ports, self.env
        if report is not None:
            self._send(report)
            self.report = report
        outcome = report.outcome if report is not None else self.stop_reason.value.upper()
        p.records.record_completed(env.job_id, env.epoch, outcome, self.clock.now())
        p.queue.delete(self.lease.receipt)
        if count and report is not None:
            p.metrics.jobs.labels(report.outcome).inc()

