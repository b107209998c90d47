"""Process helpers shared by the agent's functional tests (not a conftest: names must stay importable)."""

from __future__ import annotations

import time

import psutil


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float) -> float:
    """Wait until every pid is gone; return the seconds it took, or fail the test after ``timeout``."""
    t0 = time.monotonic()
    while not all(gone(p) for p in pids):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"processes {[p for p in pids if not gone(p)]} still alive after {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - t0
