"""The dev stack's start-up components: the function init phases run on a thread of their own while later components
start, and its ``ready`` component waits for them (the stack is ready only once they are done) and raises a failure;
the interpreter's switch interval holds while the stack runs and is restored after."""

from __future__ import annotations

import sys
import threading

import pytest

from gpufleet.devstack.components import FunctionInit
from gpufleet.devstack.supervisor import Supervisor
from gpufleet.errors import ConfigError


class _Later:
    name = "later"

    def __init__(self, on_start) -> None:
        self.on_start = on_start

    def start(self) -> None:
        self.on_start()

    def stop(self) -> None:
        return None

    def describe(self) -> dict[str, str]:
        return {}


def test_init_runs_beside_later_components_and_ready_waits_for_it():
    log: list[str] = []
    release = threading.Event()

    def initialize(key: str) -> bool:
        release.wait(5)  # held until a later component has started: they overlap
        log.append(f"init {key}")
        return key != "plain"

    init = FunctionInit(initialize, ("check_prompt", "plain"))
    Supervisor([init, _Later(lambda: (log.append("later started"), release.set())), init.ready]).start()
    assert log == ["later started", "init check_prompt", "init plain"]
    assert set(init.took) == {"check_prompt"}  # only a function that had an init phase
    assert init.describe()["function init"].startswith("check_prompt ")


def test_a_failed_init_fails_the_start_at_ready():
    def initialize(key: str) -> bool:
        raise RuntimeError("encoder weights missing")

    init = FunctionInit(initialize, ("check_prompt",))
    with pytest.raises(ConfigError, match="encoder weights missing"):
        Supervisor([init, init.ready]).start()


def test_the_switch_interval_holds_while_the_stack_runs_and_is_restored():
    from gpufleet.devstack.components import SwitchInterval

    before = sys.getswitchinterval()
    component = SwitchInterval(0.001)
    Supervisor([component]).start()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        component.stop()
    assert sys.getswitchinterval() == pytest.approx(before)
