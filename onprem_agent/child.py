"""One job's worker process, in its own process group.

Contract:
- :func:`spawn` starts ``command + ["--envelope-file", path]`` as the leader of a
  new session/process group (so a signal to the group reaches everything the
  job started), with ``CUDA_VISIBLE_DEVICES`` set to the placed GPUs (empty on
  a CPU-only node) and stdout/stderr appended to the job's log file.
- :meth:`Child.signal` sends to the whole group. SIGKILL also reaches every
  descendant that moved to a process group of its own (the runtime's
  container stage starts the user command in a new session): it is a
  tree kill, decided on a snapshot taken before the leader dies.
  :meth:`Child.kill` sends SIGKILL and waits until no member is left.
- On Linux the child is spawned with ``PR_SET_PDEATHSIG`` = ``orphan_signal``
  (SIGTERM by default): if the agent dies (kill -9, OOM) the runtime is told at
  once and checkpoints instead of running on unsupervised. The signal is tied
  to the spawning thread, which is the job's runner thread and lives exactly as
  long as the child. Whatever survives (grandchildren, a runtime ignoring the
  signal) is killed by the next agent from its pid records.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpufleet.clock import WaitingClock
from onprem_agent.settings import AgentSettings
from onprem_agent.state import group_alive, wait_until


def child_environment(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    gpu_indices: list[int],
    real_gpus: bool,
    cache_dir: Path,
    job_id: str,
    epoch: int,
    dist: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a job process (pure). Agent settings never leak into it. ``dist`` is a gang
    member's torchrun-style variables (:func:`gpufleet.gang.dist_env`), set last so nothing overrides them."""
    env = {k: v for k, v in base.items() if not k.startswith("GPUFLEET_AGENT_")}
    env.update(extra)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices) if real_gpus else ""
    env["GPUFLEET_CACHE_DIR"] = str(cache_dir)
    env["GPUFLEET_JOB_ID"] = job_id
    env["GPUFLEET_EPOCH"] = str(epoch)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(dist or {})
    return env


def agent_env_extra(settings: AgentSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """What the agent adds to every job's environment (pure; ``environ`` is the agent's own)."""
    extra = {
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        "GPUFLEET_JOBS_TABLE": settings.jobs_table,
        "GPUFLEET_CONTROL_TABLE": settings.control_table,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA numbers GPUs as NVML does
        "GPUFLEET_CACHE_REVERIFY_S": str(settings.cache_reverify_s),  # the node cache's one re-hash interval
    }
    if "GPUFLEET_STATE_DIR" not in environ:
        extra["GPUFLEET_STATE_DIR"] = str(settings.state_dir / "runtime")
    if settings.endpoint_url:
        extra["AWS_ENDPOINT_URL"] = settings.endpoint_url
    if settings.node_api_url:  # the runtime's job-item writes and object credentials come through it
        extra["GPUFLEET_NODE_API_URL"] = settings.node_api_url
    extra.update(settings.child_env)
    # Last, so no site setting can change it: the role lets a node write only objects tagged with its own id.
    extra["GPUFLEET_NODE_ID"] = settings.node_id
    return extra


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) if sys.platform == "linux" else None


def _parent_death_signal(sig: int):
    """A preexec_fn that asks the kernel to send ``sig`` to the child when its parent thread dies."""
    prctl = _libc.prctl if _libc is not None else None

    def apply() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return apply


@dataclass
class Child:
    proc: subprocess.Popen
    clock: WaitingClock
    started_at: float
    _extra_groups: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the child leads its own group

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        others: set[int] = set()
        if sig == signal.SIGKILL:
            own = os.getpgid(0)
            try:
                for d in psutil.Process(self.pid).children(recursive=True):
                    try:
                        others.add(os.getpgid(d.pid))
                    except ProcessLookupError:
                        continue
            except psutil.NoSuchProcess:
                pass
            others -= {self.pgid, own}
            self._extra_groups |= others
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        for pgid in others:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                continue

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the whole group; reap the leader; wait until the group is empty (bounded)."""
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        wait_until(lambda: not self.group_alive(), self.clock, timeout)

    def group_alive(self) -> bool:
        return group_alive(self.pgid) or any(group_alive(g) for g in self._extra_groups)


def spawn(
    command: list[str], envelope_file: Path, env: dict[str, str], log_file: Path, cwd: Path, *,
    clock: WaitingClock, orphan_signal: int | None = signal.SIGTERM,
) -> Child:
    log_fh = open(log_file, "ab")
    try:
        proc = subprocess.Popen(
            [*command, "--envelope-file", str(envelope_file)],
            env=env,
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_parent_death_signal(orphan_signal) if orphan_signal else None,
        )
    finally:
        log_fh.close()
    return Child(proc=proc, clock=clock, started_at=clock.now())
