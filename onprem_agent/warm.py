"""Warm workers on the agent's side: a pool of long-lived runtime processes, one per GPU set, and the
:class:`WarmChild` a job runner drives exactly as it drives a fresh :class:`onprem_agent.child.Child`.

Contract (the worker's side is :mod:`gpufleet.runtime.worker`; docs/agent.md, "Warm workers"):
- :func:`serves` says which envelopes run on a warm worker: the platform's own ``generate`` stage, not
  a gang member. Tenant container jobs and everything else get a fresh process (docs/security.md).
- :class:`WorkerPool` keeps at most one worker per GPU set (the placement's indices), started with
  that set's environment (``CUDA_VISIBLE_DEVICES``) in a session of its own, stderr to
  ``<state>/workers/<gpus>.log``. Workers are started by one pool thread that lives as long as the pool,
  so the parent-death signal (``PR_SET_PDEATHSIG``, tied to the spawning thread) fires only when the
  agent dies. A job on a GPU set evicts the idle workers of overlapping sets first (their models would
  share its GPUs' memory).
- :meth:`WorkerPool.run` hands a job to its set's idle worker (starting one if there is none) and
  returns a :class:`WarmChild`: ``poll()`` is the job's exit code once the worker replied ``done`` (the
  worker goes back to the pool idle), or the worker's exit status if it died (negative for a signal:
  a SYSTEM failure of the attempt; the pool starts a fresh worker for the set at once);
  :meth:`WarmChild.notify_on_reply` names a callback run after each reply (the job runner's wake-up). ``signal``
  reaches the worker's process group while the job runs (the first stop signal sent before the worker installed
  the job's handlers is held and sent when it has); after ``done`` nothing is sent. SIGKILL kills the worker
  (and its group): the job fails, the worker is replaced — and never handed another job, even when the job's
  ``done`` was already written as the signal went out (a fenced job ending by itself: it keeps its own code).
- :meth:`WorkerPool.resident_models` is the union of model names the live workers hold (each ``done``
  reply says which): the node advertises it as ``resident_models``.
- Batches (``batch_max_members`` > 1; docs/agent.md, "Batching"): a :class:`BatchLaunch` gathers the runners
  of compatible jobs the agent dispatched together on one GPU set; each runner, once its pre-flight checks
  pass, joins it (:meth:`BatchLaunch.join`; or withdraws, :meth:`BatchLaunch.withdraw`, if it will not run). When every
  runner has answered, the launch sends the set's worker one batch request (one member left: a plain job
  request, as without batching) and each runner gets a :class:`MemberChild`, again with the interface of
  :class:`onprem_agent.child.Child`: ``poll()`` is the member's own exit code (its ``done`` reply) and
  ``gpu_seconds`` its part of the batch's GPU time; ``signal(SIGTERM)`` asks the worker to stop that member
  (``{"stop": id, "reason"}``: PREEMPTED for a drain, CANCELLED, TIMED_OUT, per the runner's stop reason) and
  ``signal(SIGKILL)`` to stop it as FENCED; a signal cannot single out one member of a shared process, so
  SIGKILL reaches the worker (and every member) only if the member is still running ``kill_grace_s`` after
  the first. The worker returns to the pool idle after its ``batch_done`` reply.
- :meth:`WorkerPool.close` closes every worker's stdin (EOF: an idle worker exits) and kills what is
  left after ``timeout``.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.clock import WaitingClock
from gpufleet.envelope import Envelope
from onprem_agent.child import Child, _parent_death_signal

log = logging.getLogger("onprem_agent.warm")

Key = tuple[int, ...]


def serves(env: Envelope) -> bool:
    """Whether ``env`` runs on a warm worker (see module contract)."""
    return env.stage == "generate" and env.gang is None


@dataclass
class WarmWorker:
    key: Key
    child: Child  # the worker process (its group, tree kill)
    replies: queue.Queue = field(default_factory=queue.Queue)
    resident: list[str] = field(default_factory=list)
    busy: bool = False
    #: called after every reply (and at EOF): the job runner's wake-up, so it sees ``done`` at once
    on_reply: Callable[[], None] | None = None
    #: sent SIGKILL: never handed another job, even when its job's ``done`` had been written before the signal
    #: landed (a fenced job that ended by itself as the agent killed it) and it still looks alive for a moment
    doomed: bool = False

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker (its group); it is replaced, never reused (``doomed``)."""
        self.doomed = True
        self.child.signal(signal.SIGKILL)

    def send(self, request: dict) -> None:
        stdin = self.child.proc.stdin
        stdin.write((json.dumps(request) + "\n").encode())
        stdin.flush()

    def read_replies(self) -> None:
        """The reader thread: every reply line onto ``replies``; None at EOF."""
        out = self.child.proc.stdout
        for line in out:
            try:
                self.replies.put(json.loads(line))
            except json.JSONDecodeError:
                continue
            self._notify()
        self.replies.put(None)
        self._notify()

    def _notify(self) -> None:
        callback = self.on_reply
        if callback is not None:
            callback()


class WarmChild:
    """One job on a warm worker, with the interface of :class:`onprem_agent.child.Child` (module contract)."""

    def __init__(self, pool: WorkerPool, worker: WarmWorker, started_at: float) -> None:
        self.pool = pool
        self.worker = worker
        self.clock = worker.child.clock
        self.started_at = started_at
        self._code: int | None = None
        self._started = False
        self._pending_stop: int | None = None  # a stop signal sent before the job started: sent at its start
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.worker.pid

    @property
    def pgid(self) -> int:
        return self.worker.child.pgid

    def notify_on_reply(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the worker replies while it runs this job (the runner's wake-up: it polls
        at once instead of at its next tick)."""
        self.worker.on_reply = callback

    def poll(self) -> int | None:
        with self._lock:
            while self._code is None:
                try:
                    reply = self.worker.replies.get_nowait()
                except queue.Empty:
                    return None
                self._handle(reply)
            return self._code

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the job's code is known (None if ``timeout`` passes first)."""
        end = None if timeout is None else self.clock.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if end is None else end - self.clock.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                reply = self.worker.replies.get(timeout=left)
            except queue.Empty:
                return None
            with self._lock:
                self._handle(reply)
        return code

    def _handle(self, reply: dict | None) -> None:
        if reply is None:  # EOF: the worker died mid-job
            try:
                self.worker.child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.worker.child.signal(signal.SIGKILL)
                self.worker.child.proc.wait(timeout=5)
            self._code = self.worker.child.proc.returncode
            self.pool.discard(self.worker)
            return
        event = reply.get("event")
        if event == "started":
            self._started = True
            if self._pending_stop is not None:
                self.worker.child.signal(self._pending_stop)
        elif event == "done":
            self._code = int(reply["exit_code"])
            self.worker.resident = list(reply.get("resident") or [])
            # a worker killed as its job ended is discarded (and replaced), never handed the next job
            (self.pool.discard if self.worker.doomed else self.pool.release)(self.worker)

    def signal(self, sig: int) -> None:
        with self._lock:
            if self._code is not None:
                return  # the job is over: the worker serves others now
            if sig != signal.SIGKILL and not self._started:
                self._pending_stop = self._pending_stop or sig  # the first stop, as the runtime keeps it
                return
            if sig == signal.SIGKILL:
                self.worker.kill()
            else:
                self.worker.child.signal(sig)

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the worker while it runs this job (it is replaced); nothing once the job is done."""
        if self._code is not None and self.worker.alive():
            return
        self.signal(signal.SIGKILL)
        while self.poll() is None and self.worker.alive():
            self.clock.sleep(0.02)
        self.worker.child.kill(timeout)

    def group_alive(self) -> bool:
        """Whether anything of a worker that died is left (a finished job leaves the worker itself, idle)."""
        if self._code is not None and self.worker.alive():
            return False
        return self.worker.child.group_alive()


#: the stop a member is asked for, by the runner's reason (a drain preempts; a SIGKILL fences)
_STOP_FOR = {"drained": "PREEMPTED", "cancelled": "CANCELLED", "timed_out": "TIMED_OUT"}


class BatchRun:
    """The replies of one batch request, routed to its members (module contract)."""

    def __init__(self, pool: WorkerPool, worker: WarmWorker, ids: list[str], clock) -> None:
        self.pool = pool
        self.worker = worker
        self.clock = clock
        self.codes: dict[str, int] = {}
        self.gpu_seconds: dict[str, float] = {}
        self.ended = False
        self._lock = threading.Lock()
        self._ids = ids

    def pump(self, timeout: float | None = None) -> None:
        """Take the replies there are (waiting up to ``timeout`` for one)."""
        with self._lock:
            first = True
            while not self.ended:
                try:
                    reply = self.worker.replies.get(timeout=timeout) if first and timeout else \
                        self.worker.replies.get_nowait()
                except queue.Empty:
                    return
                first = False
                self._handle(reply)

    def _handle(self, reply: dict | None) -> None:
        if reply is None:  # EOF: the worker died mid-batch: every member still running ends with its status
            try:
                self.worker.child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.worker.child.signal(signal.SIGKILL)
                self.worker.child.proc.wait(timeout=5)
            for i in self._ids:
                self.codes.setdefault(i, self.worker.child.proc.returncode)
            self.ended = True
            self.pool.discard(self.worker)
            return
        event = reply.get("event")
        if event == "done":
            self.codes[str(reply["id"])] = int(reply["exit_code"])
            self.gpu_seconds[str(reply["id"])] = float(reply.get("gpu_seconds") or 0.0)
        elif event == "batch_done":
            self.worker.resident = list(reply.get("resident") or [])
            self.ended = True
            (self.pool.discard if self.worker.doomed else self.pool.release)(self.worker)

    def stop(self, member: str, reason: str) -> None:
        if member in self.codes or self.ended:
            return
        try:
            self.worker.send({"stop": member, "reason": reason})
        except OSError:  # the worker is gone: EOF tells the members
            pass


class MemberChild:
    """One job of a batch on a warm worker, with the interface of :class:`onprem_agent.child.Child`."""

    def __init__(self, run: BatchRun, member: str, stop_reason: Callable[[], str], kill_grace_s: float) -> None:
        self.run = run
        self.member = member
        self.stop_reason = stop_reason
        self.kill_grace_s = kill_grace_s
        self.clock = run.clock
        self._killing_since: float | None = None
        self._asked: str | None = None

    @property
    def pid(self) -> int:
        return self.run.worker.pid

    @property
    def pgid(self) -> int:
        return self.run.worker.child.pgid

    @property
    def gpu_seconds(self) -> float | None:
        return self.run.gpu_seconds.get(self.member)

    def poll(self) -> int | None:
        self.run.pump()
        return self.run.codes.get(self.member)

    def wait(self, timeout: float | None = None) -> int | None:
        end = None if timeout is None else self.clock.monotonic() + timeout
        while (code := self.poll()) is None:
            if end is not None and self.clock.monotonic() >= end:
                return None
            self.run.pump(0.05)
        return code

    def signal(self, sig: int) -> None:
        if self.poll() is not None:
            return  # the member is over: the worker serves the others
        if sig == signal.SIGKILL:
            now = self.clock.monotonic()
            if self._killing_since is None:
                self._killing_since = now
            elif now - self._killing_since >= self.kill_grace_s:
                self.run.worker.kill()  # the member hangs: the whole worker goes
                return
            reason = "FENCED"
        else:
            reason = _STOP_FOR.get(self.stop_reason(), "PREEMPTED")
        if self._asked != reason:
            self._asked = reason
            self.run.stop(self.member, reason)

    def kill(self, timeout: float = 5.0) -> None:
        if self.poll() is not None and self.run.worker.alive():
            return
        self.run.worker.kill()
        self.wait(timeout)
        self.run.worker.child.kill(timeout)

    def group_alive(self) -> bool:
        if self.poll() is not None and self.run.worker.alive():
            return False
        return self.run.worker.child.group_alive()


class BatchLaunch:
    """The runners of one batch meeting before their jobs go to the worker (module contract)."""

    def __init__(self, pool: WorkerPool, key: Key, expected: int, kill_grace_s: float) -> None:
        self.pool = pool
        self.key = key
        self.kill_grace_s = kill_grace_s
        self._expected = expected
        self._jobs: dict[str, tuple[list[str], dict[str, str], Path, Callable[[], str]]] = {}
        self._answered: set[str] = set()
        self._children: dict[str, object] = {}
        self._error: BaseException | None = None
        self._cv = threading.Condition()

    def join(self, member: str, argv: list[str], env: dict[str, str], log_file: Path,
             stop_reason: Callable[[], str]):
        """Wait for the other members' answers; the member's child (a MemberChild, or a WarmChild if alone)."""
        with self._cv:
            self._jobs[member] = (list(argv), dict(env), log_file, stop_reason)
            self._answered.add(member)
            self._maybe_launch()
            self._cv.wait_for(lambda: member in self._children or self._error is not None)
            if member not in self._children:
                raise RuntimeError(f"batch launch failed: {self._error}")
            return self._children[member]

    def withdraw(self, member: str) -> None:
        """The member will not run (its pre-flight said no, or it already joined: then nothing changes)."""
        with self._cv:
            if member in self._answered:
                return
            self._answered.add(member)
            self._maybe_launch()

    def _maybe_launch(self) -> None:
        if len(self._answered) < self._expected or not self._jobs or self._children or self._error:
            return
        try:
            if len(self._jobs) == 1:
                (member, (argv, env, log_file, _stop)), = self._jobs.items()
                self._children[member] = self.pool.run(self.key, argv, env, log_file)
            else:
                self._children.update(self.pool.run_batch(self.key, self._jobs, self.kill_grace_s))
        except BaseException as err:  # noqa: BLE001 - every waiting member sees it
            self._error = err
        self._cv.notify_all()


class WorkerPool:
    """Warm workers by GPU set (see module contract)."""

    def __init__(self, *, command: list[str], env_for: Callable[[Key], dict[str, str]], work_dir: Path,
                 log_dir: Path, clock: WaitingClock, orphan_signal: int | None = signal.SIGTERM,
                 on_replace: Callable[[], None] = lambda: None) -> None:
        self.command = list(command)
        self.env_for = env_for
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.clock = clock
        self.orphan_signal = orphan_signal
        self.on_replace = on_replace  # a worker died and is being replaced (metrics)
        self._workers: dict[Key, WarmWorker] = {}
        self._pending: dict[Key, Future] = {}  # a worker being started for the set
        self._lock = threading.RLock()  # _adopt may run inside _starting (a start already done)
        self._closed = False
        self._tasks: queue.Queue = queue.Queue()
        self._spawner = threading.Thread(target=self._spawn_loop, name="warm-spawner", daemon=True)
        self._spawner.start()

    # the spawning thread (lives as long as the pool: the parent-death signal is tied to it) ---------
    def _spawn_loop(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            key, fut = task
            try:
                fut.set_result(self._spawn_now(key))
            except Exception as err:  # noqa: BLE001 - handed to the caller
                fut.set_exception(err)

    def _spawn_now(self, key: Key) -> WarmWorker:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        name = "-".join(str(i) for i in key) or "cpu"
        log_fh = open(self.log_dir / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(
                self.command, env=self.env_for(key), cwd=str(self.work_dir), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log_fh, start_new_session=True, close_fds=True,
                preexec_fn=_parent_death_signal(self.orphan_signal) if self.orphan_signal else None,
            )
        finally:
            log_fh.close()
        worker = WarmWorker(key=key, child=Child(proc=proc, clock=self.clock, started_at=self.clock.now()))
        threading.Thread(target=worker.read_replies, name=f"warm-{name}", daemon=True).start()
        log.info("warm worker started", extra={"gpus": list(key), "pid": proc.pid})
        return worker

    def _spawn(self, key: Key) -> Future:
        fut: Future = Future()
        self._tasks.put((key, fut))
        return fut

    # the pool --------------------------------------------------------------------------------
    def prestart(self, keys: list[Key]) -> None:
        """Start an idle worker for each set in ``keys`` that has none (in the background)."""
        for key in keys:
            with self._lock:
                live = key in self._workers and self._workers[key].alive()
            if not live:
                self._starting(key)

    def _starting(self, key: Key) -> Future:
        """The future worker of ``key``: the one being started, or a new start (adopted into the pool)."""
        with self._lock:
            fut = self._pending.get(key)
            if fut is None:
                fut = self._pending[key] = self._spawn(key)
                fut.add_done_callback(lambda f, k=key: self._adopt(k, f))
            return fut

    def _adopt(self, key: Key, fut: Future) -> None:
        with self._lock:
            if self._pending.get(key) is fut:
                del self._pending[key]
            if fut.exception() is not None:
                log.warning("could not start a warm worker", extra={"gpus": list(key), "detail": str(fut.exception())})
                return
            worker = fut.result()
            current = self._workers.get(key)
            surplus = self._closed or (current is not None and current is not worker and current.alive())
            if not surplus:
                self._workers[key] = worker
        if surplus:
            self._stop(worker)

    def run(self, key: Key, argv: list[str], env: dict[str, str], log_file: Path) -> WarmChild:
        """Hand one job to ``key``'s worker (see module contract)."""
        worker = self._take(key)
        worker.send({"argv": list(argv), "env": dict(env), "log": str(log_file)})
        return WarmChild(self, worker, self.clock.now())

    def _take(self, key: Key) -> WarmWorker:
        """``key``'s worker, marked busy (started if there is none; idle workers of overlapping sets stopped)."""
        evicted = []
        with self._lock:
            for k, w in list(self._workers.items()):
                if k != key and set(k) & set(key) and not w.busy:
                    evicted.append(self._workers.pop(k))
            worker = self._workers.get(key)
            if worker is not None and (worker.doomed or not worker.alive()):
                del self._workers[key]
                worker = None
            if worker is not None:
                worker.busy = True
        for w in evicted:
            log.info("warm worker of overlapping GPUs stopped", extra={"gpus": list(w.key), "pid": w.pid})
            self._stop(w)
        if worker is None:
            worker = self._starting(key).result()
            with self._lock:
                self._workers[key] = worker  # (adopted already, or about to be: the same worker)
                worker.busy = True
        return worker

    def run_batch(self, key: Key, jobs: dict[str, tuple[list[str], dict[str, str], Path, Callable[[], str]]],
                  kill_grace_s: float) -> dict[str, MemberChild]:
        """Hand several jobs to ``key``'s worker as one batch request (module contract)."""
        worker = self._take(key)
        ids = list(jobs)
        worker.send({"batch": [{"id": i, "argv": argv, "env": env, "log": str(log)}
                               for i, (argv, env, log, _stop) in jobs.items()]})
        run = BatchRun(self, worker, ids, self.clock)
        return {i: MemberChild(run, i, jobs[i][3], kill_grace_s) for i in ids}

    def release(self, worker: WarmWorker) -> None:
        worker.busy = False

    def discard(self, worker: WarmWorker) -> None:
        """A worker died: forget it and start a fresh one for its set."""
        with self._lock:
            if self._workers.get(worker.key) is worker:
                del self._workers[worker.key]
            closed = self._closed
        log.warning("warm worker died; replacing it", extra={"gpus": list(worker.key), "pid": worker.pid,
                                                            "returncode": worker.child.poll()})
        if not closed:
            self.on_replace()
            self.prestart([worker.key])

    def resident_models(self) -> list[str]:
        with self._lock:
            workers = list(self._workers.values())
        return sorted({name for w in workers if w.alive() for name in w.resident})

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._workers.values() if w.alive()]

    def _stop(self, worker: WarmWorker, timeout: float = 10.0) -> None:
        try:
            worker.child.proc.stdin.close()
        except OSError:
            pass
        try:
            worker.child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.child.kill()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            self._stop(w, timeout)
        self._tasks.put(None)

    def kill_all(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.child.signal(signal.SIGKILL)
