"""The foreground gate: background steps wait while a foreground section is open (bounded, never starved),
pass at once otherwise, after ``close`` and inside a section; the Lambda runner waits for its turn."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from gpufleet.local.foreground import ForegroundGate
from gpufleet.local.lambda_runner import LambdaRunner


def in_thread(target, *args) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(target(*args)), daemon=True)
    t.start()
    return t, out


def test_background_passes_at_once_when_no_foreground_is_open():
    gate = ForegroundGate(max_wait_s=5.0)
    t0 = time.monotonic()
    assert gate.background_turn() == 0.0
    assert time.monotonic() - t0 < 0.5 and gate.waits == 0


def test_background_waits_until_the_last_foreground_section_closes():
    gate = ForegroundGate(max_wait_s=10.0)
    first, second = gate.foreground(), gate.foreground()
    first.__enter__()
    second.__enter__()  # overlapping requests
    t, out = in_thread(gate.background_turn)
    time.sleep(0.2)
    first.__exit__(None, None, None)
    time.sleep(0.2)
    assert t.is_alive()  # one section is still open
    second.__exit__(None, None, None)
    t.join(5)
    assert not t.is_alive() and 0.3 <= out[0] < 5.0 and gate.waits == 1


def test_background_is_delayed_at_most_max_wait_while_the_foreground_stays_busy():
    gate = ForegroundGate(max_wait_s=0.3)
    with gate.foreground():
        t0 = time.monotonic()
        _, out = in_thread(gate.background_turn)
        while not out:
            time.sleep(0.01)
        assert 0.25 <= out[0] < 3.0 and time.monotonic() - t0 < 3.0


def test_close_lets_waiting_and_later_background_through():
    gate = ForegroundGate(max_wait_s=30.0)
    with gate.foreground():
        t, out = in_thread(gate.background_turn)
        time.sleep(0.1)
        gate.close()
        t.join(5)
        assert not t.is_alive() and out[0] < 5.0
        assert gate.background_turn() == 0.0


def test_inside_a_section_the_same_thread_never_waits():
    gate = ForegroundGate(max_wait_s=30.0)
    assert not gate.is_foreground()
    with gate.foreground():
        with gate.foreground():
            assert gate.is_foreground() and gate.busy
        assert gate.is_foreground()
        assert gate.background_turn() == 0.0
    assert not gate.is_foreground() and not gate.busy


def fn(name: str) -> SimpleNamespace:
    return SimpleNamespace(function_name=name, function_arn=f"arn:aws:lambda:us-east-1:1:function:{name}",
                           handler=f"{name}.handler", environment_vars={"GPUFLEET_FUNCTION": name},
                           memory_size=128, timeout=3, logs_group_name="", code={})


def test_lambda_runner_invocations_wait_for_their_background_turn():
    gate = ForegroundGate(max_wait_s=30.0)
    runner = LambdaRunner({}, gate=gate)
    started: list[float] = []

    def behaviour(f, event):
        started.append(time.monotonic())
        if event.get("nest"):
            return runner(f, {})[0]  # nested in a running invocation: never waits
        return "ok"

    runner._invoke = lambda f, event, request_id: behaviour(f, event)  # the handler, without an asset
    section = gate.foreground()
    section.__enter__()
    t, out = in_thread(runner, fn("background"), {"nest": True})
    time.sleep(0.3)
    assert not started  # the request is being answered: the invocation waits
    with gate.foreground():  # an invocation made inside a foreground section (the registration function)
        assert runner(fn("foreground"), {})[0] == '"ok"'
    assert len(started) == 1
    closed_at = time.monotonic()
    section.__exit__(None, None, None)
    t.join(5)
    assert not t.is_alive() and out[0][1] is False
    assert len(started) == 3 and started[1] >= closed_at and gate.waits == 1  # the nested one did not wait


def test_released_lets_queued_invocations_run_and_takes_the_lock_back():
    runner = LambdaRunner({})
    order: list[str] = []
    inside = threading.Event()
    go_on = threading.Event()

    def behaviour(f, event):
        if f.function_name == "leader":
            inside.set()
            with runner.released():  # e.g. waiting for a prompt batch
                go_on.wait(5)
            order.append("leader resumed")
            return "leader"
        order.append(f.function_name)
        go_on.set()
        return "queued"

    runner._invoke = lambda f, event, request_id: behaviour(f, event)  # the handler, without an asset
    leader, out = in_thread(runner, fn("leader"), {})
    assert inside.wait(5)
    assert runner(fn("queued"), {})[0] == '"queued"'  # ran while the leader had released the lock
    leader.join(5)
    assert not leader.is_alive() and order == ["queued", "leader resumed"]
    with runner.released():  # outside an invocation: nothing to release
        pass
    assert runner(fn("queued"), {})[0] == '"queued"'


def test_held_sections_of_another_process_count_until_released():
    gate = ForegroundGate(max_wait_s=10.0)
    gate.hold()
    gate.hold()  # two requests open in the API process
    assert gate.busy and not gate.is_foreground()  # held, not by this thread
    t, out = in_thread(gate.background_turn)
    time.sleep(0.2)
    gate.release()
    time.sleep(0.2)
    assert t.is_alive()
    gate.release(5)  # more than are open (the API process died): none open, never negative
    t.join(5)
    assert not t.is_alive() and 0.3 <= out[0] < 5.0 and not gate.busy
    gate.hold()
    assert gate.busy
    gate.release()
    assert not gate.busy
