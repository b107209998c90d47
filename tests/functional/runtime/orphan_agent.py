"""A stand-in for the on-prem agent's process shape, for the orphan tests (imported by module name).

:func:`run` is the target of a process forked from the pre-warmed launcher's server: like
the agent it has several threads alive, and one of them (the job's runner thread) forks the
runtime with ``PR_SET_PDEATHSIG`` = SIGTERM, the agent's own preexec helper
(``onprem_agent.child``), then waits. SIGKILL this process and the runtime is orphaned:
the kernel sends it SIGTERM when its parent thread dies, and again each time it is
re-parented to another of the dying threads. The runtime's pid is written to ``pid_path``.
"""

from __future__ import annotations

import os
import signal
import threading

from gpufleet.runtime.launcher import _child
from onprem_agent.child import _parent_death_signal


def run(argv: list[str], env: dict[str, str], stdout_path: str, pid_path: str, threads: int = 4) -> None:
    stop = threading.Event()
    for _ in range(threads):
        threading.Thread(target=stop.wait, daemon=True).start()

    def runner() -> None:
        pid = os.fork()
        if pid == 0:  # the runtime: told when this thread dies, as the agent's children are
            _parent_death_signal(signal.SIGTERM)()
            _child(argv, env, stdout_path)
        with open(pid_path + ".tmp", "w") as fh:
            fh.write(str(pid))
        os.replace(pid_path + ".tmp", pid_path)
        stop.wait()

    threading.Thread(target=runner, daemon=True).start()
    stop.wait()
