"""An invocation's environment is a per-thread layer: the process's environment never changes for it."""

from __future__ import annotations

import os
import threading

import pytest

from gpufleet.local import invocation_env


@pytest.fixture(autouse=True)
def layered():
    return invocation_env.install()


def test_an_invocation_sees_its_variables_over_the_process_and_nothing_is_left_after(monkeypatch):
    monkeypatch.setenv("GF_TEST_BASE", "process")
    monkeypatch.setenv("GF_TEST_SHADOWED", "process")
    with invocation_env.invocation({"GF_TEST_FN": "fn", "GF_TEST_SHADOWED": "fn"}):
        assert os.environ["GF_TEST_FN"] == "fn" and os.getenv("GF_TEST_SHADOWED") == "fn"
        assert os.environ["GF_TEST_BASE"] == "process"
        assert {"GF_TEST_FN", "GF_TEST_BASE"} <= set(os.environ) and "GF_TEST_FN" in os.environ
        assert os.environ.copy()["GF_TEST_SHADOWED"] == "fn" and dict(os.environ)["GF_TEST_FN"] == "fn"
        os.environ["GF_TEST_WRITTEN"] = "inside"  # a handler's own writes stay in its layer
        del os.environ["GF_TEST_BASE"]
        assert "GF_TEST_BASE" not in os.environ and "GF_TEST_BASE" not in dict(os.environ)
        with pytest.raises(KeyError):
            del os.environ["GF_TEST_NEVER_SET"]
    assert "GF_TEST_FN" not in os.environ and "GF_TEST_WRITTEN" not in os.environ
    assert os.environ["GF_TEST_BASE"] == "process" and os.environ["GF_TEST_SHADOWED"] == "process"
    assert os.environ.base["GF_TEST_BASE"] == "process"  # the process-wide mapping was never touched


def test_nested_invocations_stack_and_unwind():
    with invocation_env.invocation({"GF_TEST_A": "outer", "GF_TEST_B": "outer"}):
        with invocation_env.invocation({"GF_TEST_B": "inner"}):
            assert (os.environ["GF_TEST_A"], os.environ["GF_TEST_B"]) == ("outer", "inner")
        assert os.environ["GF_TEST_B"] == "outer"
    assert "GF_TEST_A" not in os.environ


def test_outside_an_invocation_writes_reach_the_process_environment(monkeypatch):
    monkeypatch.setenv("GF_TEST_PLAIN", "1")
    assert os.environ.base["GF_TEST_PLAIN"] == "1" and os.getenv("GF_TEST_PLAIN") == "1"
    with pytest.raises(TypeError):
        with invocation_env.invocation({}):
            os.environ["GF_TEST_BAD"] = 1  # type: ignore[assignment]


def test_another_thread_reading_the_whole_environment_never_races_or_sees_an_invocation():
    """The old runner set and restored os.environ: a reader iterating it on another thread got a
    KeyError for a key removed between listing and reading. Bounded: 300 invocations."""
    variables = {f"GF_TEST_RACE_{i}": str(i) for i in range(40)}
    done = threading.Event()
    seen: list[object] = []

    def read() -> None:
        while not done.is_set():
            try:
                snapshot = {k: os.environ[k] for k in os.environ}  # how pydantic-settings reads it
                copied = os.environ.copy()
            except KeyError as exc:  # pragma: no cover - the failure this test exists for
                seen.append(exc)
                return
            if any(k.startswith("GF_TEST_RACE_") for k in (*snapshot, *copied)):
                seen.append("an invocation's variable leaked to another thread")
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for _ in range(300):
            with invocation_env.invocation(variables):
                assert os.environ["GF_TEST_RACE_7"] == "7"
    finally:
        done.set()
        reader.join(10)
    assert seen == []
