"""The local Batch runner's pre-warmed executor (:mod:`gpufleet.local.prewarmed`): an attempt forked from the
server sees what a fresh ``python -m`` process would (its own session and group, exactly its environment, the
runner's directory, the server's imports) and ends as ``subprocess`` would report it; other commands are run by
the plain executor. A light preload stands in for torch here: what is imported is the launcher's business, the
runtime's own forked runs are covered by tests/functional/runtime and the e2e cloud scenarios."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.local.batch_runner import LocalJob, SubprocessExecutor
from gpufleet.local.prewarmed import PrewarmedExecutor, module_argv

pytestmark = pytest.mark.xdist_group("prewarmed")


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("runner-cwd")
    os.environ["GPUFLEET_SERVER_ONLY"] = "leaks"  # in the server's environment, never in an attempt's
    try:
        fallback = SubprocessExecutor(cwd=str(cwd), grace_s=2.0, poll_s=0.05)
        fallback.process_env.pop("GPUFLEET_SERVER_ONLY", None)
        ex = PrewarmedExecutor(fallback, modules=("prewarm_probe",), preload=["json", "prewarm_probe"])
        ex._server()  # the server starts now, with GPUFLEET_SERVER_ONLY set
        ex.forked = 0
    finally:
        os.environ.pop("GPUFLEET_SERVER_ONLY", None)
    yield ex


def _job(report: Path, mode: str, stop=lambda: False, **env) -> LocalJob:
    return LocalJob(job_id="j", job_name="n", job_queue="q", command=["python", "-m", "prewarm_probe", str(report), mode],
                    environment={"JOB_VAR": "1", **env}, stop_requested=stop)


def test_module_argv_matches_only_python_dash_m_of_the_listed_modules():
    mods = ("gpufleet.runtime",)
    assert module_argv(["python", "-m", "gpufleet.runtime", "--x"], mods) == ("gpufleet.runtime", ["--x"])
    assert module_argv([sys.executable, "-m", "gpufleet.runtime"], mods) == ("gpufleet.runtime", [])
    assert module_argv(["python", "-m", "gpufleet.runtime.worker"], mods) is None
    assert module_argv(["python", "-c", "gpufleet.runtime"], mods) is None
    assert module_argv(["/bin/sh", "-m", "gpufleet.runtime"], mods) is None
    assert module_argv(["python"], mods) is None


def test_a_forked_attempt_sees_a_fresh_process_and_its_exit_status(executor, tmp_path):
    report = tmp_path / "r.json"
    assert executor(_job(report, "exit:0")) == (0, None)
    seen = json.loads(report.read_text())
    assert seen["pgid"] == seen["sid"] == seen["pid"] != os.getpid()  # its own session and group
    assert seen["cwd"] == executor.fallback.cwd
    assert seen["argv"] == [str(report), "exit:0"]
    assert seen["env"]["JOB_VAR"] == "1" and "GPUFLEET_SERVER_ONLY" not in seen["env"]
    assert seen["env"] == {**executor.fallback.process_env, "JOB_VAR": "1"}
    assert executor.forked == 1
    code, reason = executor(_job(tmp_path / "r2.json", "exit:7"))
    assert (code, reason) == (7, "Essential container in task exited with code 7")
    assert executor(_job(tmp_path / "r3.json", "message"))[0] == 1
    assert executor(_job(tmp_path / "r4.json", "raise"))[0] == 1
    assert executor.forked == 4


def test_each_attempt_is_a_new_fork_not_a_reused_process(executor, tmp_path):
    pids = set()
    for i in range(2):
        executor(_job(tmp_path / f"r{i}.json", "exit:0", RUN=str(i)))
        seen = json.loads((tmp_path / f"r{i}.json").read_text())
        assert seen["env"]["RUN"] == str(i)
        pids.add(seen["pid"])
    assert len(pids) == 2


def test_a_stop_signals_the_attempts_whole_group(executor, tmp_path):
    report = tmp_path / "r.json"
    asked = {"at": None}

    def stop() -> bool:
        if asked["at"] is None and report.exists():
            asked["at"] = time.monotonic()
        return asked["at"] is not None

    records = tmp_path / "running"
    seen_records: list = []

    def stop_and_look() -> bool:
        if report.exists() and not seen_records:
            seen_records.extend(json.loads(p.read_text()) for p in records.glob("*.json"))
        return stop()

    executor.records = records
    t0 = time.monotonic()
    try:
        code, reason = executor(_job(report, "wait", stop=stop_and_look))
    finally:
        executor.records = None
    assert time.monotonic() - t0 < 20
    assert (code, reason) == (int(ExitCode.CANCELLED), "Terminated by TerminateJob")
    seen = json.loads(report.read_text())
    # while it ran, a record named it (its command line is the server's); none is left once it ended
    assert seen_records == [{"pid": seen["pid"], "job_id": "j", "module": "prewarm_probe", "argv": [str(report), "wait"]}]
    assert not list(records.iterdir())
    child = seen["child"]
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the attempt's child survived the group's SIGTERM"
        time.sleep(0.05)


def test_other_commands_run_as_plain_subprocesses(executor, tmp_path):
    job = LocalJob(job_id="j", job_name="n", job_queue="q",
                   command=["python", "-c", "import os, sys; sys.exit(0 if os.environ['JOB_VAR'] == '1' else 3)"],
                   environment={"JOB_VAR": "1"})
    before = executor.forked
    assert executor(job) == (0, None)
    assert executor.forked == before


def test_a_signal_ending_an_attempt_is_reported_as_subprocess_would(executor, tmp_path):
    report = tmp_path / "r.json"
    killed = {}

    def kill_when_ready() -> bool:
        if not killed and report.exists():
            os.kill(json.loads(report.read_text())["pid"], signal.SIGKILL)
            killed["yes"] = True
        return False

    code, reason = executor(_job(report, "wait", stop=kill_when_ready))
    assert (code, reason) == (int(ExitCode.SYSTEM_ERROR), "killed by signal 9")


def test_a_terminate_that_comes_before_the_exit_is_reported_still_counts_as_terminated(tmp_path):
    """A runtime that saw its own cancel exits as the API's TerminateJob arrives: Batch still had it RUNNING, so
    the job ends terminated (the plain executor's rule, so both executors report it alike)."""
    calls = {"n": 0}

    def stop_after_exit() -> bool:
        calls["n"] += 1
        return calls["n"] > 1  # false while the process runs (it exits at once), true when its end is reported

    job = LocalJob(job_id="j", job_name="n", job_queue="q",
                   command=["python", "-c", "import sys, time; time.sleep(1); sys.exit(40)"],
                   environment={}, stop_requested=stop_after_exit)
    ex = SubprocessExecutor(poll_s=2.0)
    assert ex(job) == (40, "Terminated by TerminateJob")
    never = LocalJob(job_id="j", job_name="n", job_queue="q", command=["python", "-c", "import sys; sys.exit(40)"],
                     environment={})
    assert ex(never) == (40, "Essential container in task exited with code 40")
