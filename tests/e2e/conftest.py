"""The e2e suite runs through the real embedded stack: one ``gpufleet dev`` process per test session
(three on-prem agents on the CPU, the local cloud runner, the deployed state machine on moto), with a
loopback metadata service for spot interruptions and a loopback webhook receiver.

Every e2e module marks itself ``xdist_group("e2e-stack")`` so that one xdist worker owns the stack.
The stack must stop cleanly on Ctrl-C at the end (exit 0, profile removed).
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

from gpufleet.local.imds import LocalImds


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
        stack = StackProcess(state, args)
        try:
            manifest = stack.start(READY_TIMEOUT_S)
        except RuntimeError as err:
            receiver.close()
            pytest.fail(str(err))
        world = World(manifest)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("GPUFLEET_PROFILE", str(state / "profile.json"))
            mp.delenv("GPUFLEET_ENDPOINT", raising=False)
            try:
                yield {"state": state, "stack": stack, "world": world, "imds": imds, "receiver": receiver,
                       "log": stack.log}
            finally:
                receiver.close()
                code = stack.stop()
        text = stack.tail()
        assert code == 0, text
        assert "gpufleet dev: stopped" in stack.log.read_text()
        assert not (state / "profile.json").exists()  # no stale profile pointing at a stopped stack
