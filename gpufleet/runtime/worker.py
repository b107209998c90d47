"""A warm worker: one long-lived process that runs the runtime's jobs one after another, keeping the
interpreter (torch, diffusers, the runtime imported) and the last model(s) loaded between them.

Contract (``python -m gpufleet.runtime.worker``; the agent's side is :mod:`onprem_agent.warm`):
- stdin carries requests, one JSON line each: ``{"argv": [...], "env": {...}, "log": "<path>"}``; stdout
  carries replies, one JSON line each; stderr is the worker's own log. EOF on stdin ends the worker
  (exit 0): an agent that is gone, or one closing its pool.
- Start-up imports :data:`gpufleet.runtime.launcher.PRELOAD` and sets up
  :data:`gpufleet.runtime.resident.RESIDENT` with ``GPUFLEET_WARM_MODEL_BUDGET_BYTES`` (default 0: the
  last model only), then replies ``{"event": "ready", "pid"}``.
- Per request, in this order: the job's :class:`RunControl` installs its SIGTERM/SIGINT handlers, the
  worker replies ``{"event": "started"}`` (a SIGTERM from now on reaches the job: checkpoint → PREEMPTED,
  as in a fresh process); the process environment becomes exactly ``env``; stdout and stderr (fds 1
  and 2, inherited by what the job starts) append to ``log``; :func:`gpufleet.runtime.main.main` runs
  ``argv``. Then fds 1/2 go back to the worker log, SIGTERM/SIGINT are ignored until the next job (a late
  signal meant for the finished job must not stop the next one; agent death while idle is EOF), and
  the worker replies ``{"event": "done", "exit_code": <int>, "resident": [model names]}``.
- A worker that dies mid-job (SIGKILL, a crash) writes nothing more: the agent sees EOF and the exit
  status, reports the attempt as a SYSTEM failure, and starts a fresh worker.
- Only the platform's own stages run here (the agent sends ``generate`` only): tenant container
  jobs never share a process with anyone (docs/security.md).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

from gpufleet.runtime import resident


def _reply(fd: int, body: dict) -> None:
    os.write(fd, (json.dumps(body) + "\n").encode())


def _idle_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _preload() -> None:
    from gpufleet.runtime.launcher import PRELOAD

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional stack piece: the job imports what it needs
            continue


def serve(requests_in, reply_fd: int, own_log_fd: int) -> int:
    """Run requests from ``requests_in`` (a text stream) until EOF; replies go to ``reply_fd``."""
    from gpufleet.runtime.control import RunControl
    from gpufleet.runtime.main import main

    for line in requests_in:
        if not line.strip():
            continue
        req = json.loads(line)
        control = RunControl()
        control.install_signal_handlers()
        _reply(reply_fd, {"event": "started"})
        os.environ.clear()
        os.environ.update(req["env"])
        log_fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        try:
            code = main(list(req["argv"]), install_signals=False, control=control)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(own_log_fd, 1)
            os.dup2(own_log_fd, 2)
            _idle_signals()
        names = resident.RESIDENT.names() if resident.RESIDENT is not None else []
        _reply(reply_fd, {"event": "done", "exit_code": int(code), "resident": names})
    return 0


def run() -> int:
    _idle_signals()
    reply_fd = os.dup(1)  # replies: the pipe the agent reads; fd 1 itself becomes the worker log
    own_log_fd = os.dup(2)
    os.dup2(own_log_fd, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    _preload()
    resident.RESIDENT = resident.ResidentModels(int(os.environ.get("GPUFLEET_WARM_MODEL_BUDGET_BYTES", "0") or 0))
    _reply(reply_fd, {"event": "ready", "pid": os.getpid()})
    return serve(sys.stdin, reply_fd, own_log_fd)


if __name__ == "__main__":
    sys.exit(run())
