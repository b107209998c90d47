"""The agent's local state directory: running-job pid records and completed (job, epoch) records.

Layout (all writes are write-temp-then-rename, so a kill -9 never leaves half a file):

``running/<job_id>@<epoch>.json``    {"pid", "pgid", "create_time", "job_id", "epoch", "started_at"}
``completed/<job_id>@<epoch>.json``  {"job_id", "epoch", "outcome", "at"}
``agent.pid``                        the live agent's pid (for ``--check`` and a second-instance guard)
``status.json``                      last node heartbeat, written by the live agent

Contract:
- A running record exists from just after a child is spawned until it is reaped.
  A record found at start-up belongs to a previous agent process that died: its
  process group is killed (:meth:`StateDir.reap_orphans`) if, and only if, the
  recorded pid still runs with the recorded creation time (pids are recycled).
- A completed record means "this (job, epoch) was reported": a redelivered
  message for it is deleted, never run again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpufleet.clock import WaitingClock

log = logging.getLogger("onprem_agent.state")


def _name(job_id: str, epoch: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)
    return f"{safe}@{epoch}.json"


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    # per process AND thread: the drain and the heartbeat thread may write the same file at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class RunningRecord:
    job_id: str
    epoch: int
    pid: int
    pgid: int
    create_time: float
    started_at: float


def group_alive(pgid: int) -> bool:
    """True if a live (non-zombie) process is still in process group ``pgid``.

    Zombies do not count: an exited grandchild waits for its reaper (init, or a
    container's pid 1 that may never reap), but it holds no GPU and runs no code.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def wait_until(done: Callable[[], bool], clock: WaitingClock, timeout: float, step: float = 0.02) -> bool:
    """Poll ``done`` every ``step`` seconds until it is true or ``timeout`` passes; its last value."""
    deadline = clock.monotonic() + timeout
    while not done():
        if clock.monotonic() >= deadline:
            return False
        clock.sleep(step)
    return True


class StateDir:
    def __init__(self, root: Path, clock: WaitingClock) -> None:
        self.root = Path(root)
        self.clock = clock
        self.running_dir = self.root / "running"
        self.completed_dir = self.root / "completed"
        self.envelopes_dir = self.root / "envelopes"
        self.logs_dir = self.root / "logs"
        for d in (self.running_dir, self.completed_dir, self.envelopes_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)

    # running records ---------------------------------------------------------------------------
    def record_running(self, job_id: str, epoch: int, pid: int, now: float) -> RunningRecord:
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            create_time = 0.0
        rec = RunningRecord(job_id, epoch, pid, os.getpgid(pid) if create_time else pid, create_time, now)
        write_atomic(self.running_dir / _name(job_id, epoch), rec.__dict__)
        return rec

    def clear_running(self, job_id: str, epoch: int) -> None:
        (self.running_dir / _name(job_id, epoch)).unlink(missing_ok=True)

    def running(self) -> list[RunningRecord]:
        out = []
        for p in sorted(self.running_dir.glob("*.json")):
            try:
                out.append(RunningRecord(**json.loads(p.read_text())))
            except (json.JSONDecodeError, TypeError, OSError) as err:
                log.warning("unreadable running record removed", extra={"path": str(p), "detail": str(err)})
                p.unlink(missing_ok=True)
        return out

    def reap_orphans(self, timeout: float = 5.0) -> list[RunningRecord]:
        """Kill the process groups of children left by a dead agent; return the records that were alive."""
        killed = []
        for rec in self.running():
            if _same_process(rec.pid, rec.create_time) or (group_alive(rec.pgid) and _group_leader_gone(rec)):
                log.warning(
                    "killing orphaned job process group",
                    extra={"job_id": rec.job_id, "epoch": rec.epoch, "pgid": rec.pgid},
                )
                try:
                    os.killpg(rec.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                wait_until(lambda pgid=rec.pgid: not group_alive(pgid), self.clock, timeout)
                killed.append(rec)
            self.clear_running(rec.job_id, rec.epoch)
        return killed

    # completed records -------------------------------------------------------------------------
    def record_completed(self, job_id: str, epoch: int, outcome: str, now: float) -> None:
        write_atomic(
            self.completed_dir / _name(job_id, epoch),
            {"job_id": job_id, "epoch": epoch, "outcome": outcome, "at": now},
        )

    def completed(self, job_id: str, epoch: int) -> str | None:
        """The recorded outcome of (job, epoch), or None if this node never completed it."""
        p = self.completed_dir / _name(job_id, epoch)
        try:
            return json.loads(p.read_text())["outcome"]
        except FileNotFoundError:
            return None

    def prune_completed(self, older_than: float) -> int:
        n = 0
        for p in self.completed_dir.glob("*.json"):
            if p.stat().st_mtime < older_than:
                p.unlink(missing_ok=True)
                n += 1
        return n

    # envelopes and logs ------------------------------------------------------------------------
    def envelope_path(self, job_id: str, epoch: int) -> Path:
        return self.envelopes_dir / _name(job_id, epoch)

    def log_path(self, job_id: str, epoch: int) -> Path:
        return self.logs_dir / _name(job_id, epoch).replace(".json", ".log")

    # agent pid and status ----------------------------------------------------------------------
    @property
    def pid_path(self) -> Path:
        return self.root / "agent.pid"

    @property
    def status_path(self) -> Path:
        return self.root / "status.json"

    def write_agent_pid(self, pid: int) -> None:
        """Record the live agent as ``<pid> <process creation time>`` (a recycled pid is not mistaken for it)."""
        self.pid_path.write_text(f"{pid} {psutil.Process(pid).create_time()}")

    def live_agent_pid(self) -> int | None:
        """The pid in agent.pid if that very process is still alive, else None."""
        try:
            parts = self.pid_path.read_text().split()
            pid = int(parts[0])
            created = float(parts[1]) if len(parts) > 1 else None
        except (FileNotFoundError, ValueError, IndexError):
            return None
        if created is None:
            return pid if psutil.pid_exists(pid) else None
        return pid if _same_process(pid, created) else None

    def write_status(self, data: dict[str, Any]) -> None:
        write_atomic(self.status_path, data)

    def read_status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def _same_process(pid: int, create_time: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 0.01
    except psutil.NoSuchProcess:
        return False


def _group_leader_gone(rec: RunningRecord) -> bool:
    """The leader exited but members of its group (grandchildren) remain: still ours to clean."""
    try:
        psutil.Process(rec.pid)
    except psutil.NoSuchProcess:
        return True
    return False
