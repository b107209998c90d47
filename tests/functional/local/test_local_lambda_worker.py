"""The local Lambda runner's worker processes (gpufleet.local.lambda_worker): a function's execution environment as
a process of its own, warm between invocations, one per concurrent invocation, its timeout enforced; and the runner
sending an isolated function there, outside the lock the in-process functions share."""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from gpufleet.local.lambda_runner import LambdaRunner
from gpufleet.local.lambda_worker import WorkerPool

HANDLER = '''
import os, sys, time
CALLS = 0

def handler(event, context):
    global CALLS
    CALLS += 1
    print("a log line, not an answer")
    if event.get("fail"):
        raise ValueError("bad event")
    if event.get("exit"):
        os._exit(3)
    time.sleep(event.get("sleep", 0))
    return {"pid": os.getpid(), "calls": CALLS, "env": os.environ.get("FN_VAR"), "request": context.aws_request_id,
            "left_ms": context.get_remaining_time_in_millis()}
'''


@pytest.fixture
def handler_module(tmp_path, monkeypatch):
    (tmp_path / "worker_probe_fn.py").write_text(HANDLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "worker_probe_fn.handler"


def _context(request: str = "r1", timeout_s: float = 5.0) -> dict:
    return {"function_name": "probe", "memory_limit_in_mb": 128, "invoked_function_arn": "arn:probe",
            "aws_request_id": request, "timeout_s": timeout_s, "log_group_name": ""}


def test_a_worker_stays_warm_between_invocations_and_another_starts_for_a_concurrent_one(handler_module):
    pool = WorkerPool()
    env = {**os.environ, "FN_VAR": "fn-1"}
    try:
        first = pool.invoke(("arn:probe", "e"), handler_module, env, {}, _context("r1"), 10)
        second = pool.invoke(("arn:probe", "e"), handler_module, env, {}, _context("r2"), 10)
        assert first["ok"] and second["ok"]
        assert first["payload"]["pid"] == second["payload"]["pid"] != os.getpid()  # one warm environment
        assert second["payload"]["calls"] == 2 and second["payload"]["env"] == "fn-1"
        assert second["payload"]["request"] == "r2" and 0 < second["payload"]["left_ms"] <= 5000
        out: list = []
        slow = threading.Thread(target=lambda: out.append(pool.invoke(("arn:probe", "e"), handler_module, env,
                                                                       {"sleep": 1.0}, _context(), 10)))
        slow.start()
        time.sleep(0.2)
        meanwhile = pool.invoke(("arn:probe", "e"), handler_module, env, {}, _context(), 30)
        slow.join(30)
        assert pool.workers() == 2  # the busy environment was not shared: a second one started (a cold start)
        assert meanwhile["payload"]["pid"] != out[0]["payload"]["pid"]
        # another function (another key) never gets this function's environment
        other = pool.invoke(("arn:other", "e"), handler_module, {**env, "FN_VAR": "fn-2"}, {}, _context(), 30)
        assert other["payload"]["env"] == "fn-2" and other["payload"]["calls"] == 1
    finally:
        pool.close()
    assert pool.workers() == 0


def test_a_function_with_reserved_concurrency_never_has_more_environments_than_that(handler_module):
    pool = WorkerPool()
    env = dict(os.environ)
    try:
        out: list = []
        slow = threading.Thread(target=lambda: out.append(pool.invoke(("arn:one", "e"), handler_module, env,
                                                                       {"sleep": 1.0}, _context(), 10, limit=1)))
        slow.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        queued = pool.invoke(("arn:one", "e"), handler_module, env, {}, _context(), 30, limit=1)
        waited = time.monotonic() - t0
        slow.join(30)
        assert pool.workers() == 1  # the second invocation waited for the one environment instead of starting one
        assert queued["payload"]["pid"] == out[0]["payload"]["pid"] and queued["payload"]["calls"] == 2
        assert waited >= 0.5
        # an environment that ended frees its place: the next invocation starts a fresh one
        assert pool.invoke(("arn:one", "e"), handler_module, env, {"exit": True}, _context(), 30,
                           limit=1)["errorType"] == "Runtime.ExitError"
        assert pool.invoke(("arn:one", "e"), handler_module, env, {}, _context(), 30, limit=1)["payload"]["calls"] == 1
    finally:
        pool.close()
    assert pool.workers() == 0


def test_errors_timeouts_and_exits_are_answered_as_the_lambda_runtime_reports_them(handler_module):
    pool = WorkerPool()
    env = dict(os.environ)
    try:
        failed = pool.invoke(("k",), handler_module, env, {"fail": True}, _context(), 30)
        assert failed["ok"] is False and failed["errorType"] == "ValueError" and failed["errorMessage"] == "bad event"
        assert any("ValueError" in line for line in failed["stackTrace"])
        assert pool.invoke(("k",), handler_module, env, {}, _context(), 30)["ok"]  # the environment survives it
        timed_out = pool.invoke(("k",), handler_module, env, {"sleep": 30}, _context(timeout_s=1), 1.0)
        assert timed_out["errorType"] == "Sandbox.Timedout"
        exited = pool.invoke(("k",), handler_module, env, {"exit": True}, _context(), 30)
        assert exited["errorType"] == "Runtime.ExitError"
        assert pool.workers() == 0  # both environments ended; the next invocation starts a fresh one
        assert pool.invoke(("k",), handler_module, env, {}, _context(), 30)["payload"]["calls"] == 1
    finally:
        pool.close()
    assert pool.invoke(("k",), handler_module, env, {}, _context(), 30)["errorType"] == "LocalStackStopping"


def test_the_runner_runs_an_isolated_function_outside_its_lock(handler_module):
    runner = LambdaRunner({}, endpoint_url="http://127.0.0.1:9", isolated=("finalize",))
    runner.asset_dir = lambda f: None
    runner._verify_handler = lambda asset, module: None  # the asset check itself: tests/functional/local
    fn = SimpleNamespace(function_name="fin", function_arn="arn:aws:lambda:us-east-1:1:function:fin",
                         handler=handler_module, environment_vars={"GPUFLEET_FUNCTION": "finalize", "FN_VAR": "x"},
                         memory_size=3008, timeout=30, logs_group_name="", code={})
    try:
        with runner._lock:  # another function (or the API's work) holds the in-process lock meanwhile
            out: list = []
            t = threading.Thread(target=lambda: out.append(runner(fn, {})), daemon=True)
            t.start()
            t.join(60)
        payload, errored, _ = out[0]
        body = json.loads(payload)
        assert not errored and body["env"] == "x" and body["pid"] != os.getpid()
        payload, errored, _ = runner(fn, {"fail": True})
        assert errored and json.loads(payload)["errorType"] == "ValueError"
        assert [i.errored for i in runner.invocations] == [False, True]
        # without an endpoint (in-process moto) nothing is isolated: a worker could not reach it
        assert LambdaRunner({}, isolated=("finalize",))._isolated == frozenset()
    finally:
        runner.close()
    assert runner.workers.workers() == 0
    assert json.loads(runner(fn, {})[0])["errorType"] == "LocalStackStopping"
