"""The e2e suite runs through the real embedded stack: one ``gpufleet dev`` process per test session
(three on-prem agents on the CPU, the local cloud runner, the deployed state machine on moto), with a
loopback metadata service for spot interruptions and a loopback webhook receiver.

Every e2e module marks itself ``xdist_group("e2e-stack")`` so that one xdist worker owns the stack.
The stack must stop cleanly on Ctrl-C at the end (exit 0, profile removed). It is stopped right after the last
test that uses it on its worker (:func:`pytest_runtest_teardown`), not at the end of the session: an idle stack
(its scheduler timer, agents, API processes) kept a core a quarter busy while the worker ran the rest of its tests
(about 210 s of CPU over a whole-suite run).
"""

from __future__ import annotations

import pytest
from stack_helpers import (
    AGENTS,
    FINALIZE_LAMBDA_MAX_PIXELS,
    HEARTBEAT_S,
    READY_TIMEOUT_S,
    RUNTIME_ENV,
    Receiver,
    StackProcess,
    World,
)

from gpufleet.devstack.settings import load
from gpufleet.local.imds import LocalImds
from gpufleet.local.synth import synthesize

#: the running stack's stop (the devstack fixture's end), while one runs on this worker
_STOPS: list = []


def _on_the_stack(item) -> bool:
    """Whether ``item`` uses the stack or is one of its group (whose tests xdist runs one after another)."""
    return item is not None and ("devstack" in item.fixturenames
                                 or any(m.args[:1] == ("e2e-stack",) for m in item.iter_markers("xdist_group")))


def _later_on_the_stack(item, nextitem) -> bool:
    """Whether a test after ``item`` still uses the stack. Under xdist the ``e2e-stack`` group runs on one worker
    in a row, so the next item tells; without it (``-n 0``) the opt-in modules with stacks of their own run in
    between, so the rest of the session's items tell."""
    if _on_the_stack(nextitem):
        return True
    if hasattr(item.config, "workerinput"):
        return False
    items = item.session.items
    return any(_on_the_stack(i) for i in items[items.index(item) + 1:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if _STOPS and not _later_on_the_stack(item, nextitem):
        _STOPS.pop()()


@pytest.fixture(scope="session")
def devstack(tmp_path_factory):
    state = tmp_path_factory.mktemp("devstack")
    receiver = Receiver()
    with LocalImds() as imds:
        args = ["--port", "0", "--console-port", "0", "--device", "cpu", "--scheduler-interval", "2", "--agents", str(AGENTS),
                "--heartbeat-seconds", str(HEARTBEAT_S), "--imds-endpoint", imds.endpoint,
                "--finalize-lambda-max-pixels", str(FINALIZE_LAMBDA_MAX_PIXELS)]
        for k, v in RUNTIME_ENV.items():
            args += ["--runtime-env", f"{k}={v}"]
        # The stack's template, synthesized here first: the worker that ran the template tests has the CDK's jsii
        # runtime warm (a synth in ~5 s) where the stack's own process would start it cold (~18 s and ~12 CPU s of
        # node); the stack then finds the assembly in the synth cache (gpufleet.local.synth, keyed by the context).
        synthesize(load(state_dir=state, heartbeat_seconds=HEARTBEAT_S,
                        finalize_lambda_max_pixels=FINALIZE_LAMBDA_MAX_PIXELS).cdk_context())
        stack = StackProcess(state, args)
        try:
            manifest = stack.start(READY_TIMEOUT_S)
        except RuntimeError as err:
            receiver.close()
            pytest.fail(str(err))
        world = World(manifest)
        mp = pytest.MonkeyPatch()
        mp.setenv("GPUFLEET_PROFILE", str(state / "profile.json"))
        mp.delenv("GPUFLEET_ENDPOINT", raising=False)
        done: list[int] = []

        def stop() -> None:
            if done:
                return
            try:
                receiver.close()
                done.append(stack.stop())
            finally:
                mp.undo()  # later tests on this worker see no profile of a stopped stack
            assert done[0] == 0, stack.tail()
            assert "gpufleet dev: stopped" in stack.log.read_text()
            assert not (state / "profile.json").exists()  # no stale profile pointing at a stopped stack

        _STOPS.append(stop)
        try:
            yield {"state": state, "stack": stack, "world": world, "imds": imds, "receiver": receiver,
                   "log": stack.log}
        finally:
            if stop in _STOPS:
                _STOPS.remove(stop)
            stop()
