"""The local Batch runner's executor for the platform's runtime: attempts forked from a pre-warmed server.

On AWS every Batch attempt is a fresh container whose ``python -m gpufleet.runtime`` first imports torch,
diffusers and transformers: seconds of CPU before its first step. On the embedded stack those imports ran
once per cloud attempt on the developer's own cores, beside the moto server and the agents (about 8-11 CPU s
per attempt on a 2-core machine, most of what a tiny-model attempt costs). :class:`PrewarmedExecutor` runs
an attempt whose command is the runtime (``python -m gpufleet.runtime ...``) in a process forked from a
:class:`gpufleet.runtime.launcher.PrewarmedLauncher` server that imported them once; every other command
(the tenant container's supervisor, a tool image's command) goes to the plain :class:`SubprocessExecutor`.

What an attempt sees is what a fresh process sees (the contract of :mod:`gpufleet.runtime.launcher`):
its own pid leading its own session (a stop signals the group, as for a ``start_new_session`` child), the
environment the subprocess executor would give it and nothing else (the server's is replaced), the runner's
working directory, no state of earlier attempts (each is a new fork of the server, never of an attempt),
and its exit status as ``subprocess`` reports it (``-N`` for signal N). The server starts with the first
runtime attempt (a stack that runs none never pays its imports) and ends with the process that started it.

A forked attempt's command line is the server's, not ``python -m gpufleet.runtime --envelope-json ...``; with
``records`` set, each running attempt is recorded as ``<records>/<pid>.json`` (its pid, Batch job id, module and
arguments), removed when it ends, so tools that look for a job's runtime processes (the e2e suite's
``runtime_processes``) still find them. ``stack.json`` names the folder (``batch_running``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

from gpufleet.local.batch_runner import LocalJob, SubprocessExecutor, batch_outcome, wait_stoppable

_log = logging.getLogger(__name__)

#: the modules whose ``python -m`` attempts fork from the server (the platform's runtime, as its definitions run it)
RUNTIME_MODULES = ("gpufleet.runtime",)


def module_argv(command: list[str], modules: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """(module, its arguments) when ``command`` is ``python -m MODULE ...`` for one of ``modules``, else None."""
    if len(command) < 3 or os.path.basename(command[0]) not in ("python", "python3", os.path.basename(sys.executable)):
        return None
    if command[1] != "-m" or command[2] not in modules:
        return None
    return command[2], list(command[3:])


class _Forked:
    """A forked attempt seen through the part of ``subprocess.Popen`` :func:`wait_stoppable` uses."""

    def __init__(self, process) -> None:
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode


class PrewarmedExecutor:
    """``python -m`` attempts of ``modules`` forked from a pre-warmed server; anything else through ``fallback``."""

    def __init__(self, fallback: SubprocessExecutor | None = None, *, modules: tuple[str, ...] = RUNTIME_MODULES,
                 preload: list[str] | None = None, records: Path | None = None) -> None:
        self.fallback = fallback or SubprocessExecutor()
        self.records = records
        self.modules = modules
        self._preload = preload
        self._launcher = None
        self._lock = threading.Lock()
        #: attempts forked from the server (the rest went to ``fallback``)
        self.forked = 0

    def _server(self):
        with self._lock:
            if self._launcher is None:
                from gpufleet.runtime.launcher import PrewarmedLauncher

                self._launcher = PrewarmedLauncher(self._preload)
            self.forked += 1
            return self._launcher

    def __call__(self, job: LocalJob) -> tuple[int, str | None]:
        found = module_argv(job.command, self.modules)
        if found is None:
            return self.fallback(job)
        fb = self.fallback
        proc = _Forked(self._server().run_module(*found, {**fb.process_env, **job.environment}, fb.cwd))
        _log.info("batch job %s: python -m %s forked from the pre-warmed server as pid %d", job.job_id, found[0],
                  proc.pid)
        record = self._record(proc.pid, job, *found)
        try:
            stopped = wait_stoppable(proc, job, fb.grace_s, fb.poll_s)
            proc.process.join()
        finally:
            if record is not None:
                record.unlink(missing_ok=True)
        return batch_outcome(proc.returncode, stopped)

    def _record(self, pid: int, job: LocalJob, module: str, argv: list[str]) -> Path | None:
        if self.records is None:
            return None
        self.records.mkdir(parents=True, exist_ok=True)
        path = self.records / f"{pid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": pid, "job_id": job.job_id, "module": module, "argv": argv}))
        tmp.rename(path)
        return path
