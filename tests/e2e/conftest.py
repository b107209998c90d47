"""The e2e suite runs through the real embedded stack: one ``gpufleet dev`` process per test session
(three on-prem agents on the CPU, the local cloud runner, the deployed state machine on moto), with a
loopback metadata service for spot interruptions and a loopback webhook receiver.

Every e2e module marks itself ``xdist_group("e2e-stack")`` so that one xdist worker owns the stack.
The stack must stop cleanly on Ctrl-C at the end (exit 0, profile removed).
"""

from __future__ import annotations

import pytest
from stack_helpers import Receiver, StackProcess, World

from gpufleet.local.imds import LocalImds

READY_TIMEOUT_S = 240
#: the Run state's HeartbeatSeconds in this stack: how long a silent agent is trusted
HEARTBEAT_S = 6
AGENTS = 3

#: runtime settings for every job: progress and spot polling often enough for the tests to
#: act mid-run, a checkpoint every 2 denoising steps, one torch thread (three agents share 2 cores)
RUNTIME_ENV = {
    "GPUFLEET_PROGRESS_INTERVAL_S": "0.2",
    "GPUFLEET_SPOT_POLL_S": "0.2",
    "GPUFLEET_CHECKPOINT_EVERY_STEPS": "2",
    "GPUFLEET_LOG_FLUSH_S": "1",
    "GPUFLEET_TORCH_THREADS": "1",
}


@pytest.fixture(scope="session")
def devstack(tmp_path_factory):
    state = tmp_path_factory.mktemp("devstack")
    receiver = Receiver()
    with LocalImds() as imds:
        args = ["--port", "0", "--device", "cpu", "--scheduler-interval", "0.5", "--agents", str(AGENTS),
                "--heartbeat-seconds", str(HEARTBEAT_S), "--imds-endpoint", imds.endpoint]
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
