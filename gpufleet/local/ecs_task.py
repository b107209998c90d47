"""Run a multi-container Batch job (``ecsProperties``, :mod:`gpufleet.batchdef`'s shape) on this host.

The local Batch runner's stand-in for the ECS task of a cloud container job: the ``supervisor`` container as a
process, the ``gate`` container as its condition (the ready file in the job volume), the ``tenant`` container in
rootless podman, and a task metadata endpoint (v4 ``/task``) that :class:`gpufleet.runtime.taskmeta.TenantWatch`
reads.

Contract (:class:`EcsTaskExecutor`, an executor of :class:`gpufleet.local.batch_runner.LocalJob` whose
``containers`` are the job's effective containers: the definition's with the job's ``ecsPropertiesOverride``):
- The job volume is a fresh folder ``<jobs_dir>/<batch job id>/`` (``inputs/``, ``output/``, ``checkpoint/``),
  removed when the task ends.
- The supervisor runs its container's ``command`` (``python`` is this interpreter) with an environment made of
  ``supervisor_env`` (what the stack lets it reach: the node API's URL, the object store's endpoint, the
  region, ``PATH``...; any ``AWS_*`` credential in it is dropped), its container's ``environment`` (the
  definition's, then the override's: the one-time token), ``GPUFLEET_SIDECAR_JOB_DIR`` (the job volume) and
  ``ECS_CONTAINER_METADATA_URI_V4``. Nothing else of this process's environment: no AWS credentials.
- Once the supervisor wrote :data:`gpufleet.batchdef.READY_FILE` (the gate's condition), the tenant starts:
  its container's image, command and environment, the definition's ``user`` (uid), a read-only root
  (:func:`gpufleet.runtime.oci.run_argv`'s flags: no capabilities, own namespaces, ``--network none``), the job
  volume's ``inputs`` read-only and ``output``/``checkpoint`` writable at their ``mountPoints``; its state
  (PENDING, RUNNING, STOPPED with ``ExitCode``) is what ``/task`` reports.
- The supervisor is the essential container: when it exits the tenant is stopped and the job's exit code is the
  supervisor's. ``stop_requested()`` (TerminateJob, the attempt duration) SIGTERMs the supervisor (SIGKILL
  after ``grace_s``) and stops the tenant at once (SIGKILL after :data:`TENANT_STOP_GRACE_S`), as ECS stops a
  task: every container is signalled.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpufleet.batchdef import READY_FILE
from gpufleet.errors import ConfigError
from gpufleet.local.batch_runner import batch_outcome, wait_stoppable
from gpufleet.runtime import oci

#: seconds between SIGTERM and SIGKILL when the task stops the tenant container
TENANT_STOP_GRACE_S = 2
#: ``AWS_*`` variables the supervisor may be given (no credentials among them)
AWS_ALLOWED = ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


def supervisor_environment(
    base: dict[str, str],
    container: dict[str, Any],
    job_dir: Path,
    metadata_uri: str,
) -> dict[str, str]:
    """The supervisor process's whole environment (see module contract)."""
    env = {k: v for k, v in base.items() if not k.startswith("AWS_") or k in AWS_ALLOWED}
    env.update({e["name"]: str(e["value"]) for e in container.get("environment") or []})
    env.update({"GPUFLEET_SIDECAR_JOB_DIR": str(job_dir), "ECS_CONTAINER_METADATA_URI_V4": metadata_uri})
    return env


def tenant_spec(container: dict[str, Any], job_dir: Path, name: str) -> oci.ContainerSpec:
    """The tenant container's podman spec from its ECS container properties (see module contract)."""
    mounts = []
    for m in container.get("mountPoints") or []:
        sub = m["containerPath"].removeprefix("/job/").strip("/")
        mounts.append(oci.Mount(job_dir / sub, m["containerPath"], not m.get("readOnly", False)))
    uid = int(str(container.get("user") or "65534").split(":")[0])
    if uid == 0:
        raise ConfigError("the tenant container may not run as root")
    return oci.ContainerSpec(
        name=name,
        image=container["image"],
        command=list(container.get("command") or []),
        env={e["name"]: str(e["value"]) for e in container.get("environment") or []},
        uid=uid,
        mounts=mounts,
        network="none",
        workdir="/tmp",
        labels={oci.JOB_LABEL: name},
    )


class TaskMetadata:
    """A loopback ``/task`` endpoint of one task: each container's ``KnownStatus`` and ``ExitCode``."""

    def __init__(self, names: list[str]) -> None:
        self.containers = {n: {"Name": n, "KnownStatus": "PENDING"} for n in names}
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = json.dumps({"Containers": list(meta.containers.values())}).encode()
                self.send_response(200 if self.path.endswith("/task") else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/v4/local"

    def set(self, name: str, status: str, exit_code: int | None = None) -> None:
        self.containers[name] = {
            "Name": name,
            "KnownStatus": status,
            **({} if exit_code is None else {"ExitCode": exit_code}),
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class EcsTaskExecutor:
    def __init__(
        self,
        podman: oci.Podman,
        jobs_dir: Path,
        *,
        supervisor_env: dict[str, str],
        grace_s: float = 10.0,
        poll_s: float = 0.1,
    ) -> None:
        self.podman = podman
        self.jobs_dir = Path(jobs_dir)
        self.supervisor_env = dict(supervisor_env)
        self.grace_s = grace_s
        self.poll_s = poll_s

    @contextmanager
    def task(self, job: Any) -> Iterator[tuple[dict[str, dict], Path, TaskMetadata, str]]:
        """The task's containers by name, its fresh job volume, its metadata endpoint and the tenant's container
        name; the tenant container, the endpoint and the volume are removed on exit."""
        by_name = {c["name"]: c for c in job.containers}
        work = self.jobs_dir / job.job_id
        for d in ("inputs", "output", "checkpoint"):
            (work / d).mkdir(parents=True, exist_ok=True)
        meta = TaskMetadata(list(by_name))
        tenant_name = f"gpufleet-ecs-{job.job_id}"
        try:
            yield by_name, work, meta, tenant_name
        finally:
            self.podman.remove(tenant_name)
            meta.close()
            try:
                self.podman.reclaim(work)
            except (ConfigError, subprocess.SubprocessError, OSError):
                pass  # best effort; rmtree reports nothing it cannot remove
            shutil.rmtree(work, ignore_errors=True)

    def __call__(self, job: Any) -> tuple[int, str | None]:
        with self.task(job) as (by_name, work, meta, tenant_name):
            return self._run(job, by_name, work, meta, tenant_name)

    def _run(self, job: Any, by_name: dict, work: Path, meta: TaskMetadata, tenant_name: str) -> tuple[int, str | None]:
        sup = by_name["supervisor"]
        argv = [sys.executable if i == 0 and a in ("python", "python3") else a for i, a in enumerate(sup["command"])]
        proc = subprocess.Popen(
            argv, env=supervisor_environment(self.supervisor_env, sup, work, meta.uri), start_new_session=True
        )
        meta.set("supervisor", "RUNNING")
        tenant = self.start_tenant(by_name.get("tenant"), work, meta, tenant_name, lambda: proc.poll() is not None)
        threading.Thread(target=self._stop_tenant_on_request, args=(job, proc, tenant_name), daemon=True).start()
        stopped = wait_stoppable(proc, job, self.grace_s, self.poll_s)
        meta.set("supervisor", "STOPPED", proc.returncode)
        self.podman.stop(tenant_name, TENANT_STOP_GRACE_S)  # the essential container ended: the task stops
        tenant.join(timeout=30)
        return batch_outcome(proc.returncode, stopped)

    def _stop_tenant_on_request(self, job: Any, supervisor: subprocess.Popen, name: str) -> None:
        """A stop of the task (TerminateJob, the attempt duration) reaches every container at once, as ECS's StopTask
        signals each of them: the tenant is stopped now, not after the supervisor has wound down."""
        while supervisor.poll() is None:
            if job.stop_requested():
                self.podman.stop(name, TENANT_STOP_GRACE_S)
                return
            time.sleep(self.poll_s)

    def start_tenant(self, container: dict | None, work: Path, meta: TaskMetadata, name: str,
                     supervisor_done: Callable[[], bool]) -> threading.Thread:
        """A thread that starts the tenant once the ready file exists (the gate's condition; never when the
        supervisor is done first) and reports its state on ``meta``."""
        thread = threading.Thread(target=self._tenant, args=(container, work, meta, name, supervisor_done),
                                  daemon=True)
        thread.start()
        return thread

    def _tenant(
        self, container: dict | None, work: Path, meta: TaskMetadata, name: str, supervisor_done: Callable[[], bool]
    ) -> None:
        if container is None:
            return
        ready = work / Path(READY_FILE).name
        while not ready.exists():  # the gate container's condition
            if supervisor_done():
                return
            time.sleep(self.poll_s)
        meta.set("gate", "STOPPED", 0)
        spec = tenant_spec(container, work, name)
        self.podman.hand_over(work)
        meta.set("tenant", "RUNNING")
        proc = self.podman.popen(
            *oci.run_argv(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for raw in iter(proc.stdout.readline, b""):
            sys.stderr.write(f"[tenant {name}] {raw.decode(errors='replace')}")
        proc.wait()
        meta.set("tenant", "STOPPED", proc.returncode)
