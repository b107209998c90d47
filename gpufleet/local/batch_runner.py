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
- A job of a ``multinode`` definition (a cloud gang) runs as AWS Batch runs a multi-node parallel job:
  ``NumNodes`` nodes (SubmitJob's ``nodeOverrides``, kept by :func:`gpufleet.local.moto_patches.patch_batch_runner`,
  else the definition's ``numNodes``), each a :class:`LocalJob` ``<job id>#<index>`` on the executor with its
  node range's command and environment (overrides applied) and Batch's variables ``AWS_BATCH_JOB_NODE_INDEX``,
  ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and, on child nodes only,
  ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`` (127.0.0.1: every node is this host). The job ends when its
  main node exits, with the main node's exit code and reason; the child nodes still running are then stopped as
  by ``TerminateJob`` (a child that fails first changes nothing, as on AWS). ``TerminateJob`` on the job and
  its attempt duration reach every node. Each node is recorded (``records``) and is a moto job of its own, so
  ``DescribeJobs`` answers ``<job id>#<index>`` with the node's status and exit code.
- A definition's host volumes (``volumes[].host.sourcePath`` mounted at ``mountPoints[].containerPath``) are one
  instance's disk shared by every job of the runner, as on one Batch instance: ``host_root/<sourcePath>`` (created
  on first use); an environment value naming a mount's container path (or a path under it) is rewritten to that
  folder, since a job's process sees this machine's file system. Nothing is written to the real ``sourcePath``.
- The attempt's duration limit is Batch's: the job's ``timeout.attemptDurationSeconds`` (SubmitJob), else its
  definition's. Past it ``stop_requested()`` becomes true as for ``TerminateJob`` and the job fails with AWS's
  status reason :data:`ATTEMPT_TIMEOUT_REASON`, whatever the executor returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.envelope import ExitCode
from gpufleet.local.moto_patches import ecs_properties_of, finish_job


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
    #: a multi-container job's effective containers (its definition's ``ecsProperties`` with the job's
    #: ``ecsPropertiesOverride``: :func:`gpufleet.local.moto_patches.ecs_properties_of`); empty for a
    #: ``containerProperties`` job
    containers: tuple[dict[str, Any], ...] = field(default=(), repr=False, compare=False)


Executor = Callable[[LocalJob], tuple[int, str | None]]


@dataclass(frozen=True)
class ExecutorFactory:
    """An executor made when the local stack starts, after it set the environment its jobs' processes inherit
    (the credentials, region and ``MOTO_PORT``), as the default :class:`SubprocessExecutor` is."""

    make: Callable[[], Executor]

    def __call__(self) -> Executor:
        return self.make()


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
        stopped = wait_stoppable(proc, job, self.grace_s, self.poll_s)
        return batch_outcome(proc.returncode, stopped)


def wait_stoppable(proc: subprocess.Popen, job: LocalJob, grace_s: float, poll_s: float) -> bool:
    """Wait for ``proc`` (its own process group); a stop asked of ``job`` (TerminateJob, the attempt's time
    limit) sends the group SIGTERM, then SIGKILL after ``grace_s``. True when a stop was asked, including one
    asked after the process ended but before this runner reported it (Batch still had the job RUNNING when
    TerminateJob came, as when a runtime that saw its own cancel exits while the API terminates its job)."""
    stopped_at: float | None = None
    while proc.poll() is None:
        if job.stop_requested() and stopped_at is None:
            stopped_at = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
        if stopped_at is not None and time.monotonic() - stopped_at > grace_s:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(poll_s)
    return stopped_at is not None or job.stop_requested()


def batch_outcome(code: int, stopped: bool) -> tuple[int, str | None]:
    """(exit code, Batch's status reason) of an essential process that ended with ``code``."""
    if stopped:
        return (code if code and code > 0 else int(ExitCode.CANCELLED)), "Terminated by TerminateJob"
    if code < 0:
        return int(ExitCode.SYSTEM_ERROR), f"killed by signal {-code}"
    return code, None if code == 0 else f"Essential container in task exited with code {code}"


def _in_range(target: str, index: int, num_nodes: int) -> bool:
    """Whether node ``index`` is in a Batch node range (``"2"``, ``"0:3"``, ``"1:"``, ``":"``)."""
    start, sep, end = target.partition(":")
    if not sep:
        return index == int(start)
    return (int(start) if start else 0) <= index <= (int(end) if end else num_nodes - 1)


@dataclass(frozen=True)
class NodeSpec:
    """One node of a multi-node parallel job: its index, command and environment (overrides applied)."""

    index: int
    command: list[str]
    environment: dict[str, str]
    #: the node range's container properties (its volumes and mount points)
    container: dict[str, Any] = field(default_factory=dict)


def node_specs(job: Any) -> tuple[int, list[NodeSpec]]:
    """(main node index, the nodes) of a moto job of a ``multinode`` definition, overrides applied."""
    props = job.job_definition.node_properties or {}
    overrides = getattr(job, "node_overrides", None) or {}
    num = int(overrides.get("numNodes") or props.get("numNodes") or 1)
    main = int(props.get("mainNode", 0))
    nodes = []
    for i in range(num):
        container: dict[str, Any] = next((r.get("container") or {} for r in props.get("nodeRangeProperties", [])
                                          if _in_range(r["targetNodes"], i, num)), {})
        over: dict[str, Any] = next((o.get("containerOverrides") or {} for o in overrides.get("nodePropertyOverrides", [])
                                     if _in_range(o["targetNodes"], i, num)), {})
        env = {e["name"]: str(e["value"]) for e in container.get("environment", [])}
        env.update({e["name"]: str(e["value"]) for e in over.get("environment", [])})
        env.update({"AWS_BATCH_JOB_NODE_INDEX": str(i), "AWS_BATCH_JOB_NUM_NODES": str(num),
                    "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main)})
        if i != main:  # Batch sets it on child nodes only
            env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
        nodes.append(NodeSpec(i, list(over.get("command") or container.get("command") or []), env, container))
    return main, nodes


def _no_ecs_executor(job: LocalJob) -> tuple[int, str | None]:
    raise RuntimeError("this runner has no executor for multi-container (ecsProperties) jobs")


class BatchRunner:
    """Turns moto Batch jobs into :class:`LocalJob` runs on an executor (one thread per job)."""

    def __init__(self, executor: Executor, *, base_env: Mapping[str, str] | None = None,
                 monotonic: Callable[[], float] = time.monotonic, ecs_executor: Executor | None = None,
                 host_root: Path | None = None) -> None:
        self.executor = executor
        #: the emulated instance's disk, where host volumes live (None: a temporary folder, made on first use)
        self.host_root = host_root
        #: runs multi-container (``ecsProperties``) jobs (:class:`gpufleet.local.ecs_task.EcsTaskExecutor`); None:
        #: such a job fails as a system error
        self.ecs_executor = ecs_executor
        self.monotonic = monotonic
        self.base_env = dict(base_env or {})
        #: extra environment for the jobs of one queue (by job queue name), over ``base_env``
        self.queue_env: dict[str, dict[str, str]] = {}
        self.records: list[JobRecord] = []
        self._lock = threading.Lock()

    def _host_mounted(self, container: Mapping[str, Any], env: dict[str, str]) -> dict[str, str]:
        """``env`` with the container's host-volume paths moved onto the emulated instance's disk (see module)."""
        sources = {v.get("name"): (v.get("host") or {}).get("sourcePath") for v in container.get("volumes") or []}
        moved: dict[str, str] = {}
        for m in container.get("mountPoints") or []:
            source = sources.get(m.get("sourceVolume"))
            if not source:
                continue
            if self.host_root is None:
                self.host_root = Path(tempfile.mkdtemp(prefix="gpufleet-batch-host-"))
            local = self.host_root / source.lstrip("/")
            local.mkdir(parents=True, exist_ok=True)
            moved[m["containerPath"].rstrip("/")] = str(local)
        out = dict(env)
        for name, value in env.items():
            for path, local in moved.items():
                if value == path or value.startswith(path + "/"):
                    out[name] = local + value[len(path):]
        return out

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

    @staticmethod
    def _containers(job: Any) -> tuple[dict[str, Any], ...]:
        definition = getattr(job.job_definition, "ecs_properties", None)
        if not definition:
            return ()
        effective = ecs_properties_of(definition, getattr(job, "ecs_properties_override", None))
        return tuple(c for task in effective.get("taskProperties", [])[:1] for c in task.get("containers", []))

    def local_job(self, job: Any) -> LocalJob:
        containers = self._containers(job)
        if containers:  # the executor builds each container's environment (no runner environment reaches them)
            deadline = self._deadline(job)
            return LocalJob(job_id=job.job_id, job_name=job.job_name, job_queue=job.job_queue.name,
                            job_definition=job.job_definition.name, command=[], environment={},
                            deadline=deadline, containers=containers,
                            stop_requested=self._stop_requested(job, deadline))
        props = job.job_definition.container_properties or {}
        command = list((job.container_overrides or {}).get("command") or props.get("command") or [])
        deadline = self._deadline(job)
        return LocalJob(
            job_id=job.job_id,
            job_name=job.job_name,
            job_queue=job.job_queue.name,
            job_definition=job.job_definition.name,
            command=command,
            environment=self._host_mounted(props, {**self.base_env, **self.queue_env.get(job.job_queue.name, {}),
                                                   **self._environment(job)}),
            deadline=deadline,
            stop_requested=self._stop_requested(job, deadline),
        )

    def _deadline(self, job: Any) -> float | None:
        limit = attempt_duration(job)
        return None if limit is None else self.monotonic() + limit

    def _stop_requested(self, job: Any, deadline: float | None = None) -> Callable[[], bool]:
        return lambda: bool(job.stop) or self._timed_out(deadline)

    def _node_job(self, job: Any, index: int) -> Any:
        """A moto job ``<job id>#<index>`` for one node, so DescribeJobs answers it as AWS does."""
        from moto.batch.models import Job

        node = Job(job.job_name, job.job_definition, job.job_queue, job.backend, log_backend=job._log_backend,
                   container_overrides=None, eks_properties_override=None, depends_on=None, all_jobs=job.all_jobs,
                   timeout=job.timeout, array_properties={}, provided_job_id=f"{job.job_id}#{index}", parameters=None)
        node.job_started_at = job.job_started_at
        node.status = "RUNNING"
        node._start_attempt()
        job.all_jobs[node.job_id] = node
        return node

    def _run_multinode(self, job: Any) -> None:
        main, nodes = node_specs(job)
        limit = attempt_duration(job)
        deadline = None if limit is None else self.monotonic() + limit
        main_done = threading.Event()
        results: dict[int, tuple[int, str | None]] = {}

        def run(spec: NodeSpec, moto_node: Any) -> None:
            ends_with_main = spec.index != main
            local = LocalJob(
                job_id=moto_node.job_id, job_name=job.job_name, job_queue=job.job_queue.name,
                job_definition=job.job_definition.name, command=spec.command,
                environment=self._host_mounted(spec.container, {
                    **self.base_env, **self.queue_env.get(job.job_queue.name, {}), **spec.environment,
                    "AWS_BATCH_JOB_ID": moto_node.job_id, "AWS_BATCH_JQ_NAME": job.job_queue.name}),
                deadline=deadline,
                stop_requested=lambda: bool(job.stop) or self._timed_out(deadline)
                or (ends_with_main and main_done.is_set()),
            )
            started = time.monotonic()
            try:
                code, reason = self.executor(local)
            except Exception as exc:  # a system failure of the node
                code, reason = int(ExitCode.SYSTEM_ERROR), f"local executor failed: {exc!r}"
            if not job.stop and code != 0 and self._timed_out(deadline):
                reason = ATTEMPT_TIMEOUT_REASON
            results[spec.index] = (code, reason)
            with self._lock:
                self.records.append(JobRecord(local, code, reason, time.monotonic() - started))
            finish_job(moto_node, code, reason)
            if spec.index == main:
                main_done.set()

        threads = [threading.Thread(target=run, args=(spec, self._node_job(job, spec.index)),
                                    name=f"batch-node-{job.job_id}#{spec.index}", daemon=True)
                   for spec in sorted(nodes, key=lambda s: s.index != main)]  # the main node starts first
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        code, reason = results.get(main, (int(ExitCode.SYSTEM_ERROR), "the main node did not run"))
        if job.stop and not reason:
            reason = job.job_stopped_reason or "Terminated by TerminateJob"
        finish_job(job, code, reason)

    def __call__(self, job: Any) -> None:
        job.status = "RUNNING"
        if job.job_definition.type == "multinode":
            try:
                self._run_multinode(job)
            except Exception as exc:  # the emulation itself failed: a system failure of the job, never a hang
                finish_job(job, int(ExitCode.SYSTEM_ERROR), f"local multi-node run failed: {exc!r}")
            return
        local = self.local_job(job)
        started = time.monotonic()
        executor = self.executor
        if local.containers:
            executor = self.ecs_executor or _no_ecs_executor
        try:
            code, reason = executor(local)
        except Exception as exc:  # an executor crash is a system failure of the job, reported as such
            code, reason = int(ExitCode.SYSTEM_ERROR), f"local executor failed: {exc!r}"
        if job.stop and not reason:
            reason = job.job_stopped_reason or "Terminated by TerminateJob"
        elif not job.stop and code != 0 and self._timed_out(local.deadline):
            reason = ATTEMPT_TIMEOUT_REASON
        with self._lock:
            self.records.append(JobRecord(local, code, reason, time.monotonic() - started))
        finish_job(job, code, reason)
