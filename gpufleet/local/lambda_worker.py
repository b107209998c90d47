"""A Lambda execution environment as a process of its own, for the local Lambda runner's long functions.

Contract:
- :class:`WorkerPool` keeps, per function (its ARN and environment), worker processes running
  ``python -m gpufleet.local.lambda_worker <module.function>``: each imports the handler once and then serves
  invocations one at a time, as one warm Lambda execution environment does, keeping what the handler caches
  (imports, models, clients) between them. An invocation takes an idle worker of its function or starts one
  (Lambda scales out the same way: a new environment for a concurrent invocation, a cold start); a worker is
  reused only for the function it started for. With a ``limit`` (the function's reserved concurrency) at most that
  many environments of the function exist: a further invocation waits for one of them to be free (where Lambda
  throttles it and an asynchronous caller's retry runs it later).
- Each worker's environment is the function's (the runner's :meth:`LambdaRunner._environment`: the deployed
  variables, the Lambda runtime's, the moto server's endpoint) over this process's, with ``PYTHONPATH`` naming this
  process's import path, so it imports the same (verified) handler source. It reaches AWS only through the endpoint,
  so a pool is used only in server mode.
- Protocol: one JSON line per request on the worker's stdin (``{"event", "context"}``), one JSON line per answer on
  a pipe of its own (``{"ok": true, "payload"}`` or ``{"ok": false, "errorType", "errorMessage", "stackTrace"}``,
  as the Python runtime reports an exception); the handler's own stdout and stderr go to the worker's stderr, which
  is this process's (the function's log lines).
- An invocation that outlives the function's timeout is answered ``{"errorType": "Sandbox.Timedout"}`` and its
  worker killed, as Lambda ends a timed-out environment. A worker that dies mid-invocation answers
  ``Runtime.ExitError``. :meth:`WorkerPool.close` ends every worker (idle ones at once, busy ones once they answer or
  when their timeout passes).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any


class Worker:
    """One worker process (one execution environment) of one function."""

    def __init__(self, handler: str, env: Mapping[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        environ = {**env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                   "GPUFLEET_LAMBDA_WORKER_FD": str(write_fd)}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet.local.lambda_worker", handler], env=environ,
                                     stdin=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self._answers = os.fdopen(read_fd, "rb")

    def invoke(self, event: Any, context: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bool]:
        """The answer, and whether the worker can serve again."""
        try:
            self.proc.stdin.write(json.dumps({"event": event, "context": context}, default=str).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return _error("Runtime.ExitError", "the execution environment exited before the invocation"), False
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return _error("Sandbox.Timedout", f"Task timed out after {timeout_s:.2f} seconds"), False
            ready, _, _ = select.select([self._answers], [], [], min(left, 1.0))
            if ready:
                line = self._answers.readline()
                if not line:
                    self.kill()
                    return _error("Runtime.ExitError", "the execution environment exited during the invocation"), False
                return json.loads(line), True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self._answers):
            try:
                stream.close()
            except OSError:
                pass

    def stop(self, grace_s: float = 5.0) -> None:
        """End the worker: EOF on its stdin ends its loop; killed past ``grace_s``."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "errorType": kind, "errorMessage": message, "stackTrace": []}


class WorkerPool:
    """Worker processes per function (module contract)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._idle: dict[tuple, list[Worker]] = {}
        self._count: dict[tuple, int] = {}  # key -> its workers, busy or idle
        self._all: list[Worker] = []
        self._closed = False

    def invoke(self, key: tuple, handler: str, env: Mapping[str, str], event: Any, context: dict[str, Any],
               timeout_s: float, limit: int | None = None) -> dict[str, Any]:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            # at the limit: wait for an environment of this function to be free (module contract)
            self._lock.wait_for(lambda: self._closed or idle or limit is None or self._count.get(key, 0) < limit)
            if self._closed:
                return _error("LocalStackStopping", "the local stack is stopping")
            worker = idle.pop() if idle else None
            if worker is None:
                worker = Worker(handler, env)
                self._all.append(worker)
                self._count[key] = self._count.get(key, 0) + 1
        answer, reusable = worker.invoke(event, context, timeout_s)
        with self._lock:
            if reusable and not self._closed:
                self._idle[key].append(worker)
            else:
                self._all.remove(worker)
                self._count[key] -= 1
                worker.stop() if reusable else worker.kill()
            self._lock.notify_all()
        return answer

    def workers(self) -> int:
        with self._lock:
            return len(self._all)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [w for ws in self._idle.values() for w in ws]
            self._idle.clear()
            for w in idle:
                self._all.remove(w)
            self._lock.notify_all()  # invocations waiting for an environment are answered LocalStackStopping
        for w in idle:
            w.stop()


# ----------------------------------------------------------------------------- the worker process


class _Context:
    """The Lambda context object a handler gets (the fields :class:`gpufleet.local.lambda_runner.LambdaContext` has)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        timeout_s = float(fields.pop("timeout_s"))
        self.__dict__.update(fields)
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def serve(handler_name: str) -> int:
    answers = os.fdopen(int(os.environ.pop("GPUFLEET_LAMBDA_WORKER_FD")), "w", buffering=1)
    os.dup2(2, 1)  # the handler's prints are log lines, never answers
    sys.stdout = sys.stderr
    module_name, _, attr = handler_name.rpartition(".")
    handler = getattr(importlib.import_module(module_name), attr)  # the init phase: imports once per environment
    for line in sys.stdin:
        request = json.loads(line)
        try:
            payload = handler(request["event"], _Context(dict(request["context"])))
            answer = {"ok": True, "payload": json.loads(json.dumps(payload, default=str))}
        except Exception as exc:  # the Lambda runtime reports any exception as a function error
            answer = {"ok": False, "errorType": type(exc).__name__, "errorMessage": str(exc),
                      "stackTrace": traceback.format_exception(exc)}
        answers.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
