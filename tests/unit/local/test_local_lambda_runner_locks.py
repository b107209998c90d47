"""The in-process Lambda runner: one invocation at a time (nested ones on the invoking thread), and ``close``
(the dev stack's Ctrl-C) refusing waiting invocations at once while the running one finishes."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

from gpufleet.local.lambda_runner import LambdaRunner


def fn(module: str, name: str | None = None) -> SimpleNamespace:
    name = name or module
    return SimpleNamespace(function_name=name, function_arn=f"arn:aws:lambda:us-east-1:1:function:{name}",
                           handler=f"{module}.handler", environment_vars={"GPUFLEET_FUNCTION": name},
                           memory_size=128, timeout=3, logs_group_name="", code={})


def runner_with(behaviour) -> LambdaRunner:
    runner = LambdaRunner({})
    runner._invoke = lambda f, event, request_id: behaviour(f, event)  # the handler, without an asset
    return runner


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(target(*args)), daemon=True)
    t.start()
    return t, out


def test_invocations_run_one_at_a_time():
    inside, most = [0], [0]
    guard = threading.Lock()

    def behaviour(f, event):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with guard:
            inside[0] -= 1
        return event

    runner = runner_with(behaviour)
    threads = [in_thread(runner, fn(f"mod{i % 3}", f"f{i % 2}"), {"i": i})[0] for i in range(8)]
    for t in threads:
        t.join(5)
    assert most[0] == 1
    assert runner.count() == 8 and not any(i.errored for i in runner.invocations)


def test_a_module_invoking_itself_on_its_thread_nests():
    runner: LambdaRunner

    def behaviour(f, event):
        if event.get("depth", 0) < 2:
            return json.loads(runner(f, {"depth": event.get("depth", 0) + 1})[0])
        return "bottom"

    runner = runner_with(behaviour)
    assert json.loads(runner(fn("nested"), {})[0]) == "bottom"


def test_close_refuses_waiting_invocations_at_once_and_lets_running_ones_finish():
    release = threading.Event()
    started = threading.Event()

    def behaviour(f, event):
        started.set()
        release.wait(5)
        return "finished"

    runner = runner_with(behaviour)
    running, out_running = in_thread(runner, fn("slow"), {})
    assert started.wait(5)
    waiting = [in_thread(runner, fn("slow"), {}) for _ in range(5)]  # queued behind the running one
    time.sleep(0.1)
    t0 = time.monotonic()
    runner.close()
    for t, _ in waiting:
        t.join(2)
    assert time.monotonic() - t0 < 1.0
    for _, out in waiting:
        payload, errored, _ = out[0]
        assert errored and json.loads(payload)["errorType"] == "LocalStackStopping"
    assert not runner.wait_idle(0.05)  # the running one still runs
    release.set()
    running.join(5)
    assert json.loads(out_running[0][0]) == "finished"
    assert runner.wait_idle(1)
    payload, errored, _ = runner(fn("other"), {})  # and anything new is refused too
    assert errored and json.loads(payload)["errorType"] == "LocalStackStopping"
