"""The parts of the embedded stack that are not the deployed template itself.

Each class is a :class:`gpufleet.devstack.supervisor.Component`: ``start()``, ``stop()``,
``describe()`` (name → where, for the ready banner). They take what they need explicitly
(endpoints, table names, callables), so each can be started on its own in tests.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.devstack.timer import Periodic
from gpufleet.errors import ConfigError, TransientError

log = logging.getLogger("gpufleet.devstack")


class ProvenanceKeys:
    """Development C2PA signing keys, the local trust anchor and the watermark key (created once, reused)."""

    name = "signing keys"

    def __init__(self, runtime_state_dir: Path) -> None:
        self.runtime_state_dir = runtime_state_dir
        self.trust_anchor: Path = runtime_state_dir / "provenance" / "trust_anchor.pem"
        self.watermark_keys: Path = runtime_state_dir / "provenance" / "watermark.keys"

    def start(self) -> None:
        from gpufleet.provenance.keys import dev_credentials, dev_watermark_keys

        dev_credentials(self.runtime_state_dir)
        dev_watermark_keys(self.runtime_state_dir)
        if not self.trust_anchor.is_file():
            raise ConfigError(f"development trust anchor missing at {self.trust_anchor}")

    def stop(self) -> None:
        return None  # the keys stay in the state directory for the next start

    def describe(self) -> dict[str, str]:
        return {"C2PA trust anchor": str(self.trust_anchor), "watermark keys": str(self.watermark_keys)}


class LocalTsa:
    """A local RFC 3161 time-stamp authority (:mod:`gpufleet.provenance.tsa`) that time-stamps the C2PA
    signatures of the stack's runtime (``GPUFLEET_TSA_URL``). Its keys live in the runtime state dir;
    the port is bound on construction so the URL is known before the runners start."""

    name = "time-stamp authority"

    def __init__(self, runtime_state_dir: Path) -> None:
        from gpufleet.provenance.tsa import TsaServer, dev_tsa

        self.root = runtime_state_dir / "provenance" / "tsa_root.pem"
        self.server = TsaServer(dev_tsa(runtime_state_dir))
        self.url = self.server.url

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def describe(self) -> dict[str, str]:
        return {"RFC 3161 time-stamp authority": self.url, "TSA root": str(self.root)}


#: what a pass report counts that changed something (a pass with none of them found nothing to do)
PASS_CHANGES = ("placed", "preempted", "expired", "lost")


def pass_did_work(report: Any) -> bool:
    """Whether a scheduler pass report (``PassReport.as_dict``) shows a change; anything else (no report, a
    skipped pass) counts as work, so the timer keeps its period."""
    if not isinstance(report, Mapping) or report.get("skipped"):
        return True
    return any(report.get(k) for k in PASS_CHANGES)


class SwitchInterval:
    """The interpreter's switch interval while the stack runs (``sys.setswitchinterval``; restored on stop).

    Why: this one process serves the API's moto requests (foreground, I/O-bound: a request releases the interpreter
    lock at every socket read and write and must take it back) beside CPU-bound background threads (the workflow's
    CheckPrompt batches, Step Functions, stream deliveries). With the default 5 ms interval each hand-back can wait
    5 ms for a busy thread to yield, dozens of times per request (the convoy effect). At 1 ms, on an idle two-core
    machine, 5 submissions/s for 60 s (docs/benchmarks.md, admission, seventh round): request p99 0.75-0.76 s against
    1.38-5.49 s at 5 ms, CPU per job no worse."""

    name = "interpreter switch interval"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._saved: float | None = None

    def start(self) -> None:
        self._saved = sys.getswitchinterval()
        sys.setswitchinterval(self.interval_s)

    def stop(self) -> None:
        if self._saved is not None:
            sys.setswitchinterval(self._saved)
            self._saved = None

    def describe(self) -> dict[str, str]:
        return {}


class FunctionInit:
    """The init phase of the in-process functions named (CheckPrompt: its prompt filter's encoder, policy and speller,
    ~3 CPU s), run at start (an execution environment warmed ahead of its first event), so the first jobs' checks, and the requests
    that would queue behind them, do not pay for it (:meth:`gpufleet.local.harness.LocalStack.initialize`). It runs
    on a thread of its own while the next components start; :attr:`ready` (a component placed before the
    scheduler timer) waits for it and raises its error, so the stack is ready only once it is done."""

    name = "function init"

    def __init__(self, initialize: Callable[[str], bool], keys: tuple[str, ...]) -> None:
        self.initialize = initialize
        self.keys = keys
        #: function key -> seconds its init took (only the functions that have one)
        self.took: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.ready = _Awaited(self)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="function-init", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for key in self.keys:
                t0 = time.monotonic()
                if self.initialize(key):
                    self.took[key] = time.monotonic() - t0
        except BaseException as err:  # noqa: BLE001 - raised by wait() on the starting thread
            self._error = err

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise ConfigError(f"a function's init phase failed: {type(self._error).__name__}: {self._error}")

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(30.0)

    def describe(self) -> dict[str, str]:
        return {"function init": ", ".join(f"{k} {s:.1f}s" for k, s in self.took.items()) or "none"}


class _Awaited:
    name = "function init done"

    def __init__(self, init: FunctionInit) -> None:
        self.init = init

    def start(self) -> None:
        self.init.wait()

    def stop(self) -> None:
        return None

    def describe(self) -> dict[str, str]:
        return {}


class SchedulerTimer:
    """Runs one scheduler pass every ``interval_s`` (production: an EventBridge schedule + events). :meth:`stop`
    waits ``stop_wait_s`` at most for a pass in flight (one queued behind other in-process work returns once the
    stack's Lambda runner is closed: :meth:`join` then waits for it).

    With ``idle_max_s`` above ``interval_s``, a pass that changed nothing (:func:`pass_did_work`: nothing placed,
    preempted, expired, lost or backed off) doubles the period, up to ``idle_max_s``; a pass that changed something
    sets it back to ``interval_s``. Jobs waiting for capacity are re-examined by the ``JobPending``/``CapacityFreed``
    events' passes at once, so the timer is the backstop for what no event announces (a node registering or coming
    back, a backoff or deadline running out, a lost node): an idle stack, or one holding parked jobs, then re-reads
    its pending jobs every ``idle_max_s`` instead of every ``interval_s``."""

    name = "scheduler pass timer"

    def __init__(self, run_pass: Callable[[], Any], interval_s: float, stop_wait_s: float = 1.0,
                 idle_max_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.idle_max_s = max(interval_s, idle_max_s if idle_max_s is not None else interval_s)
        self._run_pass = run_pass
        self.timer = Periodic("scheduler-pass", self._tick, interval_s)
        self.stop_wait_s = stop_wait_s

    def _tick(self) -> Any:
        try:
            report = self._run_pass()
        except Exception:
            self.timer.interval_s = self.interval_s
            raise
        idle = not pass_did_work(report)
        self.timer.interval_s = min(self.idle_max_s, self.timer.interval_s * 2) if idle else self.interval_s
        return report

    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop(self.stop_wait_s)

    def join(self, timeout: float) -> bool:
        return self.timer.join(timeout)

    def describe(self) -> dict[str, str]:
        if self.idle_max_s > self.interval_s:
            return {"scheduler pass": f"every {self.interval_s:g}s (up to {self.idle_max_s:g}s while passes find nothing to do)"}
        return {"scheduler pass": f"every {self.interval_s:g}s"}

    def problem(self) -> str | None:
        t = self.timer
        if t.runs >= 5 and t.errors == t.runs:
            return f"every scheduler pass fails: {t.last_error}"
        return None


class AgentProcess:
    """One on-prem agent (``python -m onprem_agent``) in its own process group.

    ``env`` carries its settings (``GPUFLEET_AGENT_*``) and AWS endpoint. :meth:`start` is
    :meth:`launch` then :meth:`wait_ready`: ready once its node item appears in the control table
    (``node_ready()`` returns true). Stop: SIGTERM (the agent drains: running jobs checkpoint and
    are reported preempted; a paused agent is continued so it can), then SIGKILL of its process
    group after ``grace_s``. :meth:`terminate` + :meth:`wait_stopped` let a caller stop several at once.
    """

    name = "on-prem agent"

    def __init__(
        self,
        node_id: str,
        env: Mapping[str, str],
        log_path: Path,
        node_ready: Callable[[], bool],
        *,
        device: str,
        ready_timeout_s: float = 90.0,
        grace_s: float = 30.0,
    ) -> None:
        self.node_id = node_id
        self.env = dict(env)
        self.log_path = log_path
        self.node_ready = node_ready
        self.device = device
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # kept after stop, for the record

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "onprem_agent"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self._launched = time.monotonic()

    def wait_ready(self) -> None:
        if self.proc is None:
            raise ConfigError(f"agent {self.node_id} is not launched")
        deadline = self._launched + self.ready_timeout_s
        while not self.node_ready():
            if self.proc.poll() is not None:
                raise TransientError(f"agent {self.node_id} exited with code {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise TransientError(
                    f"agent {self.node_id} did not register its node within {self.ready_timeout_s:g}s: {self.tail()}"
                )
            time.sleep(0.2)

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return " | ".join(text) or "(empty log)"

    def terminate(self) -> None:
        """Ask the agent to drain (SIGTERM; SIGCONT in case it was paused). No-op if it is not running."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def wait_stopped(self, deadline: float | None = None) -> None:
        """Wait until the agent exits (until ``deadline``, monotonic; default ``grace_s`` from now);
        past it, SIGKILL its process group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        timeout = max(0.0, (deadline if deadline is not None else time.monotonic() + self.grace_s) - time.monotonic())
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("agent %s did not drain within %.0fs; killing its process group", self.node_id, timeout)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()

    def exit_code(self) -> int | None:
        """The exit code once the agent process is gone (negative: killed by that signal), else None."""
        return self.proc.poll() if self.proc is not None else None

    def problem(self) -> str | None:
        code = self.exit_code()
        if code is not None:
            return f"agent {self.node_id} (pid {self.pid}) exited with code {code}: {self.tail()}"
        return None

    def record(self) -> dict[str, Any]:
        """What ``stack.json`` says about this agent."""
        return {"node_id": self.node_id, "pid": self.pid, "log": str(self.log_path), "device": self.device}

    def describe(self) -> dict[str, str]:
        return {f"agent {self.node_id}": f"pid {self.pid} on {self.device}, log {self.log_path}"}


def detect_device(requested: str) -> str:
    """``cuda`` when asked for or (``auto``) when torch sees a GPU, else ``cpu``."""
    if requested != "auto":
        return requested
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    tmp.replace(path)
