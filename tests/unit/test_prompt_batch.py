"""Prompt checks made at once share one decide call inside a yield window; alone (no window) they are decided
at once; an error reaches every caller of its batch."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from gpufleet.prompt_batch import PromptBatcher, yielding


def decider(calls: list[list[str]], fail: bool = False):
    def decide(prompts: list[str]) -> list[str]:
        calls.append(list(prompts))
        if fail:
            raise RuntimeError("encoder down")
        return [p.upper() for p in prompts]

    return decide


def test_without_a_yield_window_each_check_is_decided_at_once():
    calls: list[list[str]] = []
    batcher = PromptBatcher(decider(calls), quiet_s=5.0, max_wait_s=5.0)
    t0 = time.monotonic()
    assert [batcher.check("a"), batcher.check("b")] == ["A", "B"]
    assert calls == [["a"], ["b"]] and time.monotonic() - t0 < 2.0


def test_checks_arriving_while_the_leader_waits_share_one_batch_and_get_their_own_decision():
    calls: list[list[str]] = []
    batcher = PromptBatcher(decider(calls), quiet_s=0.3, max_wait_s=5.0)
    window_entries = []

    @contextmanager
    def window():
        window_entries.append(threading.get_ident())
        yield

    results: dict[str, str] = {}

    def run(p: str) -> None:
        results[p] = batcher.check(p)

    with yielding(window):
        threads = [threading.Thread(target=run, args=(p,)) for p in ("x", "y", "z")]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
    assert results == {"x": "X", "y": "Y", "z": "Z"}
    assert len(calls) == 1 and sorted(calls[0]) == ["x", "y", "z"] and len(window_entries) == 3
    assert batcher.batches == 1 and batcher.prompts == 3


def test_a_full_batch_is_decided_and_later_checks_start_the_next():
    calls: list[list[str]] = []
    batcher = PromptBatcher(decider(calls), quiet_s=0.3, max_wait_s=5.0, max_batch=2)
    out: list[str] = []
    with yielding(lambda: contextmanager(lambda: (yield))()):
        threads = [threading.Thread(target=lambda p=p: out.append(batcher.check(p))) for p in "abc"]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
    assert sorted(out) == ["A", "B", "C"] and sorted(len(c) for c in calls) == [1, 2]


def test_an_error_reaches_every_caller_of_the_batch():
    calls: list[list[str]] = []
    batcher = PromptBatcher(decider(calls, fail=True), quiet_s=0.3, max_wait_s=5.0)
    errors: list[BaseException] = []

    def run(p: str) -> None:
        try:
            batcher.check(p)
        except RuntimeError as err:
            errors.append(err)

    with yielding(lambda: contextmanager(lambda: (yield))()):
        threads = [threading.Thread(target=run, args=(p,)) for p in "ab"]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
    assert len(calls) == 1 and len(errors) == 2
    with pytest.raises(RuntimeError):
        batcher.check("alone")  # no window: decided (and failing) at once


def test_a_leader_with_nothing_queued_decides_at_once_and_one_with_queued_work_waits_for_it():
    calls: list[list[str]] = []
    batcher = PromptBatcher(decider(calls), quiet_s=1.0, max_wait_s=5.0)
    opened = []

    @contextmanager
    def window():
        opened.append(1)
        yield

    with yielding(window, queued=lambda: 0):
        t0 = time.monotonic()
        assert batcher.check("alone") == "ALONE"
        assert time.monotonic() - t0 < 0.5 and len(opened) == 1  # the window still opened; no quiet_s wait
    waiting = [1]  # one invocation waits to run: the leader waits for it to join
    out: dict[str, str] = {}
    with yielding(window, queued=lambda: len(waiting)):
        leader = threading.Thread(target=lambda: out.setdefault("a", batcher.check("a")))
        leader.start()
        time.sleep(0.2)
        waiting.clear()
        out["b"] = batcher.check("b")
        leader.join(10)
    assert out == {"a": "A", "b": "B"} and calls[-1] == ["a", "b"]
