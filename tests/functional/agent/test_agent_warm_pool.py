"""The warm worker pool's process management, with a minimal worker that speaks the protocol of
``gpufleet.runtime.worker`` (no torch: each job's exit code is its argv[0]; "hang" never ends): one worker per GPU set,
reused job after job; a job on an overlapping set stops the idle worker of the other set first; a
worker that dies is replaced; closing the pool ends every worker."""

from __future__ import annotations

import signal
import sys
import textwrap

import psutil

from gpufleet.clock import SystemClock
from onprem_agent.warm import WorkerPool

WORKER = textwrap.dedent('''
    import json, os, signal, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    out.write(json.dumps({"event": "ready", "pid": os.getpid()}) + "\\n")
    for line in sys.stdin:
        req = json.loads(line)
        out.write(json.dumps({"event": "started"}) + "\\n")
        if req["argv"][0] == "hang":
            sys.stdin.readline()  # a job that never ends (until the worker is killed)
        out.write(json.dumps({"event": "done", "exit_code": int(req["argv"][0]), "resident": ["m"]}) + "\\n")
''')


def _pool(tmp_path) -> WorkerPool:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return WorkerPool(command=[sys.executable, str(script)], env_for=lambda key: {"GPUS": ",".join(map(str, key))},
                      work_dir=tmp_path, log_dir=tmp_path / "workers", clock=SystemClock())


def _code(job) -> int:
    code = job.wait(60)
    assert code is not None, "the worker never answered"
    return code


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_one_worker_per_gpu_set_reused_replaced_and_evicted_by_an_overlapping_set(tmp_path):
    pool = _pool(tmp_path)
    try:
        first = pool.run((0,), ["0"], {}, tmp_path / "j1.log")
        assert _code(first) == 0
        second = pool.run((0,), ["20"], {}, tmp_path / "j2.log")
        assert _code(second) == 20 and second.pid == first.pid  # the same worker, the job's own code
        assert pool.resident_models() == ["m"]

        wide = pool.run((0, 1), ["0"], {}, tmp_path / "j3.log")  # overlaps (0,): that idle worker is stopped
        assert _code(wide) == 0 and wide.pid != first.pid
        first.worker.child.proc.wait(10)
        assert pool.pids() == [wide.pid]

        doomed = pool.run((0, 1), ["hang"], {}, tmp_path / "j4.log")
        doomed.signal(signal.SIGKILL)  # the worker dies mid-job: the job's code is the signal
        assert _code(doomed) == -signal.SIGKILL
        nxt = pool.run((0, 1), ["0"], {}, tmp_path / "j5.log")  # a fresh worker serves the next job
        assert _code(nxt) == 0 and nxt.pid != doomed.pid
    finally:
        pids = pool.pids()
        pool.close()
    assert all(_gone(p) for p in pids)
