"""A warm worker: one long-lived process that runs the runtime's jobs one after another, keeping the
interpreter (torch, diffusers, the runtime imported) and the last model(s) loaded between them.

Contract (``python -m gpufleet.runtime.worker``; the agent's side is :mod:`onprem_agent.warm`):
- stdin carries requests, one JSON line each: ``{"argv": [...], "env": {...}, "log": "<path>"}``; stdout
  carries replies, one JSON line each; stderr is the worker's own log. EOF on stdin ends the worker
  (exit 0): an agent that is gone, or one closing its pool.
- Start-up imports :data:`gpufleet.runtime.launcher.PRELOAD` and sets up
  :data:`gpufleet.runtime.resident.RESIDENT` with ``GPUFLEET_WARM_MODEL_BUDGET_BYTES`` (default 0: the
  last model only), then replies ``{"event": "ready", "pid"}``.
- Per request, in this order: the job's :class:`RunControl` installs its stop-signal handlers, the
  worker replies ``{"event": "started"}`` (a stop signal from now on reaches the job: SIGTERM → checkpoint →
  PREEMPTED, SIGUSR1 → CANCELLED, SIGUSR2 → TIMED_OUT, as in a fresh process); the process environment becomes exactly ``env``; stdout and stderr (fds 1
  and 2, inherited by what the job starts) append to ``log``; :func:`gpufleet.runtime.main.main` runs
  ``argv``. Then fds 1/2 go back to the worker log, the stop signals and SIGINT are ignored until the next job (a late
  signal meant for the finished job must not stop the next one; agent death while idle is EOF), and
  the worker replies ``{"event": "done", "exit_code": <int>, "resident": [model names]}``.
- A worker that dies mid-job (SIGKILL, a crash) writes nothing more: the agent sees EOF and the exit
  status, reports the attempt as a SYSTEM failure, and starts a fresh worker.
- A batch request ``{"batch": [{"id", "argv", "env", "log"}, ...]}`` (compatible ``generate`` jobs,
  :func:`gpufleet.batching.batch_key`) runs every job's stage at once, each on a thread of its own with its
  own settings (from its ``env``), control, log (appended, as its stdout and stderr) and a
  :class:`gpufleet.runtime.batchloop.BatchMember` of one :class:`DenoiseBatch`: their denoising steps run
  as one batch, bounded by the memory :func:`free_bytes` reports (the GPU's free memory; on the CPU
  ``GPUFLEET_BATCH_MEMORY_BYTES``). The worker replies ``started`` once, ``{"event": "done", "id",
  "exit_code", "gpu_seconds"}`` as each member ends (its GPU-seconds: the batch's time split among the
  members present, :meth:`gpufleet.runtime.batchloop.BatchMember.depart`), and ``{"event": "batch_done", "resident"}`` last. Meanwhile
  stdin may carry ``{"stop": "<id>", "reason": "CANCELLED" | "FENCED" | "TIMED_OUT" | "PREEMPTED"}``: that
  member's control is asked to stop, so it leaves the batch at its next step boundary (cancel, fencing and
  the time limit cannot be signals here: a signal reaches the whole process). SIGTERM/SIGINT preempt every
  member (the agent's drain); EOF does the same, then the worker ends once the members have.
- Only the platform's own stages run here (the agent sends ``generate`` only): tenant container
  jobs never share a process with anyone (docs/security.md).
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import signal
import sys
import threading

from gpufleet.runtime import resident


def _reply(fd: int, body: dict) -> None:
    os.write(fd, (json.dumps(body) + "\n").encode())


def _idle_signals() -> None:
    from gpufleet.envelope import STOP_SIGNALS

    for sig in (*STOP_SIGNALS.values(), signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _preload() -> None:
    from gpufleet.runtime.launcher import PRELOAD

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional stack piece: the job imports what it needs
            continue


def serve(requests_in, reply_fd: int, own_log_fd: int) -> int:
    """Run requests from ``requests_in`` (a text stream) until EOF; replies go to ``reply_fd``."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in requests_in:
            if line.strip():
                lines.put(line)
        lines.put(None)  # EOF

    threading.Thread(target=read, name="requests", daemon=True).start()
    while True:
        line = lines.get()
        if line is None:
            return 0
        req = json.loads(line)
        if "batch" in req:
            if _run_batch(req["batch"], lines, reply_fd):
                return 0  # EOF during the batch
        elif "argv" in req:
            _run_one(req, reply_fd, own_log_fd)
        # anything else (a stop for a batch member that already ended) is stale: ignored


def _run_one(req: dict, reply_fd: int, own_log_fd: int) -> None:
    from gpufleet.runtime.control import RunControl
    from gpufleet.runtime.main import main

    control = RunControl()
    control.install_signal_handlers()
    _reply(reply_fd, {"event": "started"})
    os.environ.clear()
    os.environ.update(req["env"])
    log_fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        code = main(list(req["argv"]), install_signals=False, control=control)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(own_log_fd, 1)
        os.dup2(own_log_fd, 2)
        _idle_signals()
    _reply(reply_fd, {"event": "done", "exit_code": int(code), "resident": _resident()})


def _resident() -> list[str]:
    return resident.RESIDENT.names() if resident.RESIDENT is not None else []


#: what a stop request may ask of a batch member (the agent's cancel, fencing and time limit)
_STOPS = {"CANCELLED", "FENCED", "TIMED_OUT", "PREEMPTED"}


def _run_batch(jobs: list[dict], lines: queue.Queue, reply_fd: int) -> bool:
    """Run ``jobs`` as one denoising batch: each job's stage on a thread of its own (see module contract).
    True if stdin ended meanwhile."""
    from gpufleet.envelope import ExitCode
    from gpufleet.runtime.batchloop import DenoiseBatch
    from gpufleet.runtime.control import RunControl

    batch = DenoiseBatch(len(jobs), max_members=len(jobs), free_bytes=free_bytes)
    controls = {job["id"]: RunControl() for job in jobs}

    def preempt_all(signum, _frame) -> None:  # the agent's drain (or the parent-death signal): every member
        for c in controls.values():
            c.request(ExitCode.PREEMPTED, f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, preempt_all)
    signal.signal(signal.SIGINT, preempt_all)
    _reply(reply_fd, {"event": "started"})
    os.environ.clear()
    os.environ.update(jobs[0]["env"])  # what members share (region, tables, node); each loads its own settings
    lock = threading.Lock()

    def reply(body: dict) -> None:
        with lock:
            _reply(reply_fd, body)

    threads = [threading.Thread(target=run_member, args=(job, controls[job["id"]], batch.member(), reply),
                                name=f"member-{job['id']}", daemon=True) for job in jobs]
    for t in threads:
        t.start()
    eof = False
    try:
        while any(t.is_alive() for t in threads):
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:  # the agent is gone: the members stop as a drain would stop them
                eof = True
                preempt_all(signal.SIGTERM, None)
                continue
            stop = json.loads(line)
            control = controls.get(str(stop.get("stop")))
            if control is not None and stop.get("reason") in _STOPS:
                control.request(ExitCode[stop["reason"]], stop.get("detail") or "stopped by the agent")
        for t in threads:
            t.join()
    finally:
        _idle_signals()
    reply({"event": "batch_done", "resident": _resident()})
    return eof


def run_member(job: dict, control, member, reply, **main_kw) -> int:
    """One batch member's stage on this thread: the runtime's ``main`` with the member's settings, its log as
    stdout/stderr and its :class:`BatchMember`; replies ``done`` with its exit code and GPU-seconds."""
    from gpufleet.envelope import ExitCode
    from gpufleet.errors import ConfigError
    from gpufleet.runtime.main import main
    from gpufleet.runtime.settings import RuntimeSettings

    member.arrive()
    code = int(ExitCode.SYSTEM_ERROR)
    try:
        with open(job["log"], "a", buffering=1, encoding="utf-8") as log:
            try:
                settings = main_kw.pop("settings", None) or RuntimeSettings.load(job["env"])
            except ConfigError:
                settings = None  # main reports the invalid settings
            code = main(list(job["argv"]), settings=settings, install_signals=False, control=control, stdout=log,
                        stderr=log, batch=member, **main_kw)
    finally:
        member.leave()
        reply({"event": "done", "id": job["id"], "exit_code": int(code), "gpu_seconds": round(member.depart(), 4)})
    return code


#: the CPU memory a batch may use (``GPUFLEET_BATCH_MEMORY_BYTES`` of the worker, read at start-up; 0: no bound)
CPU_BATCH_BYTES = 2 * 2**30


def free_bytes() -> int | None:
    """The memory a batch may use: the GPU's free memory, or :data:`CPU_BATCH_BYTES` on the CPU."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    return CPU_BATCH_BYTES or None


def run() -> int:
    _idle_signals()
    reply_fd = os.dup(1)  # replies: the pipe the agent reads; fd 1 itself becomes the worker log
    own_log_fd = os.dup(2)
    os.dup2(own_log_fd, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    _preload()
    resident.RESIDENT = resident.ResidentModels(int(os.environ.get("GPUFLEET_WARM_MODEL_BUDGET_BYTES", "0") or 0))
    global CPU_BATCH_BYTES
    CPU_BATCH_BYTES = int(os.environ.get("GPUFLEET_BATCH_MEMORY_BYTES", str(CPU_BATCH_BYTES)) or 0)
    from gpufleet.runtime import denoise  # (torch: loaded by _preload)

    denoise.set_pad_rows(int(os.environ.get("GPUFLEET_BATCH_PAD_ROWS", "0") or 0))  # GPU calls only
    _reply(reply_fd, {"event": "ready", "pid": os.getpid()})
    return serve(sys.stdin, reply_fd, own_log_fd)


if __name__ == "__main__":
    sys.exit(run())
