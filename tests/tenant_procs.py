"""Finding a tenant's command among the host's processes, for the tests that cancel a container job and time how
long its command survives."""

from __future__ import annotations

import os

import psutil


def marked_pids(marker: str, *, tenant_only: bool = False) -> list[int]:
    """Processes (not zombies, not pytest) whose command line carries ``marker``. ``tenant_only``: those inside the
    container (another PID namespace than this test's) — the tenant's command and the container's init, not the
    ``podman run`` client whose argv also names the command and which exits only after removing the container
    (``--rm``); a process whose namespace cannot be read counts as the tenant's."""
    own = os.readlink("/proc/self/ns/pid")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if marker not in cmdline or "pytest" in cmdline or proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if tenant_only:
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/pid") == own:
                    continue
            except FileNotFoundError:  # gone meanwhile
                continue
            except OSError:
                pass
        found.append(proc.pid)
    return found
