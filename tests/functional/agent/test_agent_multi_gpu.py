"""A job with ``gpus: 2`` on a node offering 4 GPUs sees exactly the 2 it was placed on.

The agent runs in this process with an NVML-shaped inventory of 4 GPUs (this machine has no
driver; the inventory is the only thing standing in for hardware): the message, slots, runner,
child environment, node API and the worker process are the real ones. The contract runtime records
the ``CUDA_VISIBLE_DEVICES`` it was started with.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from gpufleet.clock import SystemClock
from onprem_agent.agent import Agent
from onprem_agent.gpus import Device, Inventory
from onprem_agent.settings import AgentSettings

REPO = Path(__file__).resolve().parents[3]
CONTRACT_RUNTIME = Path(__file__).with_name("contract_runtime.py")

FOUR_GPUS = Inventory(kind="nvml", devices=tuple(Device(i, "NVIDIA A100-SXM4-80GB", 80.0, f"GPU-{i}") for i in range(4)),
                      driver="550.0")


@pytest.fixture
def gpu_agent(fleet, tmp_path):
    node = "gpu4"
    fleet.register(node, gpus=4)
    settings = AgentSettings(
        node_id=node, pool="onprem-test", queue_url=fleet.node_queue(node), region="us-east-1",
        endpoint_url=fleet.endpoint, node_api_url=fleet.gateway.url, jobs_table=fleet.tables.jobs,
        control_table=fleet.tables.control, state_dir=tmp_path / "state", cache_dir=tmp_path / "cache",
        runtime_command=[sys.executable, str(CONTRACT_RUNTIME)], poll_wait_s=1, visibility_timeout_s=4,
        heartbeat_interval_s=0.5, node_heartbeat_s=1.0, node_ttl_s=5, metrics_enabled=False,
    )
    environ = {**fleet.node_env(node), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    agent = Agent(settings, clock=SystemClock(), environ=environ, sqs=fleet.sqs, node_api=fleet.node_api(node),
                  inventory=FOUR_GPUS)
    t = threading.Thread(target=agent.run, name="agent-gpu4", daemon=True)
    t.start()
    yield node
    agent.request_drain()
    t.join(30)


def test_two_gpus_placed_on_a_four_gpu_node_are_exactly_the_visible_devices(fleet, gpu_agent):
    spec = {"workload": {"kind": "container", "image": "contract-runtime", "command": ["run"],
                         "env": {"RECORD_FILE": str(fleet.records), "STEPS": "2"}},
            "resources": {"gpus": 2}}
    fleet.submit("j-2gpu", spec=spec)
    epoch = fleet.place("j-2gpu", gpu_agent, gpu_indices=[1, 3])
    start = fleet.wait_event("j-2gpu", "start")
    assert start["cuda"] == "1,3"
    assert fleet.wait_execution("j-2gpu", epoch)["status"] == "SUCCEEDED"
