"""Run AWS Batch jobs locally: the runner behind moto's simple Batch backend.

Contract:
- :class:`BatchRunner` is the ``runner`` of
  :func:`gpufleet.local.moto_patches.patch_batch_runner`. For each submitted
  job it builds a :class:`LocalJob` (id, name, queue, job definition name, attempt deadline, command with overrides,
  environment = ``base_env``, then ``queue_env`` of its queue, then job definition + overrides) and hands it to an
  executor, then records the outcome on the moto job (exit code, reason,
  SUCCEEDED iff the exit code is 0) so ``DescribeJobs`` and ``submitJob.sync``
  see it as they would in AWS.
- An executor is any callable ``(LocalJob) -> (exit_code, reason)``. It must
  return when ``job.stop_requested()`` becomes true (``TerminateJob``).
  :class:`SubprocessExecutor` runs the command (``python`` is this
  interpreter) in a child process; it can only reach moto through a moto
  server (``AWS_ENDPOINT_URL`` in ``base_env``). The child's environment starts from this process's
  environment as it was when the executor was made, never with an in-process Lambda invocation's variables.
- An executor that raises counts as a system error
  (:data:`gpufleet.envelope.ExitCode.SYSTEM_ERROR`).
- The attempt's duration limit is Batch's: the job's ``timeout.attemptDurationSeconds`` (SubmitJob), else its
  definition's. Past it ``stop_requested()`` becomes true as for ``TerminateJob`` and the job fails with AWS's
  status reason :data:`ATTEMPT_TIMEOUT_REASON`, whatever the executor returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.envelope import ExitCode
from gpufleet.local.moto_patches import finish_job


@dataclass(frozen=True)
class LocalJob:
    job_id: str
    job_name: str
    job_queue: str
    command: list[str]
    environment: dict[str, str]
    #: the name of the job definition it was submitted with (whose job role it runs under on AWS)
    job_definition: str = ""
    #: when its attempt duration runs out (the runner's clock), or None: no limit
    deadline: float | None = None
    stop_requested: Callable[[], bool] = field(repr=False, compare=False, default=lambda: False)


Executor = Callable[[LocalJob], tuple[int, str | None]]
#: AWS Batch's status reason for an attempt stopped at its ``attemptDurationSeconds``
ATTEMPT_TIMEOUT_REASON = "Job attempt duration exceeded timeout"


def attempt_duration(job: Any) -> float | None:
    """The moto job's ``attemptDurationSeconds``: its own (SubmitJob's ``timeout``), else its definition's."""
    for timeout in (getattr(job, "timeout", None), getattr(job.job_definition, "timeout", None)):
        if timeout and timeout.get("attemptDurationSeconds") is not None:
            return float(timeout["attemptDurationSeconds"])
    return None


@dataclass
class JobRecord:
    job: LocalJob
    exit_code: int
    reason: str | None
    seconds: float


class SubprocessExecutor:
    """Run the job's command in a child process group; SIGTERM it (then SIGKILL) when stop is requested."""

    def __init__(self, *, cwd: str | None = None, grace_s: float = 10.0, poll_s: float = 0.1) -> None:
        self.cwd = cwd
        self.grace_s = grace_s
        self.poll_s = poll_s
        # the process environment as it is now: a job must not depend on what the process sets later (an
        # in-process Lambda's variables are a per-thread layer it never sees: gpufleet.local.invocation_env)
        self.process_env = os.environ.copy()

    def __call__(self, job: LocalJob) -> tuple[int, str | None]:
        argv = [sys.executable if i == 0 and a in ("python", "python3") else a for i, a in enumerate(job.command)]
        env = {**self.process_env, **job.environment}
        proc = subprocess.Popen(argv, env=env, cwd=self.cwd, start_new_session=True)
        stopped_at: float | None = None
        while proc.poll() is None:
            if job.stop_requested() and stopped_at is None:
                stopped_at = time.monotonic()
                os.killpg(proc.pid, signal.SIGTERM)
            if stopped_at is not None and time.monotonic() - stopped_at > self.grace_s:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(self.poll_s)
        code = proc.returncode
        if stopped_at is not None:
            return (code if code and code > 0 else int(ExitCode.CANCELLED)), "Terminated by TerminateJob"
        if code < 0:
            return int(ExitCode.SYSTEM_ERROR), f"killed by signal {-code}"
        return code, None if code == 0 else f"Essential container in task exited with code {code}"


class BatchRunner:
    """Turns moto Batch jobs into :class:`LocalJob` runs on an executor (one thread per job)."""

    def __init__(self, executor: Executor, *, base_env: Mapping[str, str] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.monotonic = monotonic
        self.base_env = dict(base_env or {})
        #: extra environment for the jobs of one queue (by job queue name), over ``base_env``
        self.queue_env: dict[str, dict[str, str]] = {}
        self.records: list[JobRecord] = []
        self._lock = threading.Lock()

    @staticmethod
    def _environment(job: Any) -> dict[str, str]:
        props = job.job_definition.container_properties or {}
        env = {e["name"]: str(e["value"]) for e in props.get("environment", [])}
        env.update({e["name"]: str(e["value"]) for e in (job.container_overrides or {}).get("environment", [])})
        env["AWS_BATCH_JOB_ID"] = job.job_id
        env["AWS_BATCH_JQ_NAME"] = job.job_queue.name
        return env

    def _timed_out(self, deadline: float | None) -> bool:
        return deadline is not None and self.monotonic() >= deadline

    def local_job(self, job: Any) -> LocalJob:
        props = job.job_definition.container_properties or {}
        command = list((job.container_overrides or {}).get("command") or props.get("command") or [])
        limit = attempt_duration(job)
        deadline = None if limit is None else self.monotonic() + limit
        return LocalJob(
            job_id=job.job_id,
            job_name=job.job_name,
            job_queue=job.job_queue.name,
            job_definition=job.job_definition.name,
            command=command,
            environment={**self.base_env, **self.queue_env.get(job.job_queue.name, {}), **self._environment(job)},
            deadline=deadline,
            stop_requested=lambda: bool(job.stop) or self._timed_out(deadline),
        )

    def __call__(self, job: Any) -> None:
        job.status = "RUNNING"
        local = self.local_job(job)
        started = time.monotonic()
        try:
            code, reason = self.executor(local)
        except Exception as exc:  # an executor crash is a system failure of the job, reported as such
            code, reason = int(ExitCode.SYSTEM_ERROR), f"local executor failed: {exc!r}"
        if job.stop and not reason:
            reason = job.job_stopped_reason or "Terminated by TerminateJob"
        elif not job.stop and code != 0 and self._timed_out(local.deadline):
            reason = ATTEMPT_TIMEOUT_REASON
        with self._lock:
            self.records.append(JobRecord(local, code, reason, time.monotonic() - started))
        finish_job(job, code, reason)
