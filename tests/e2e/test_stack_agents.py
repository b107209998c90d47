"""``gpufleet dev --agents 3`` (the session's stack): every node registers in the on-prem pool, the
ready banner and ``stack.json`` list every agent (node id, pid, log) and where moto and its resources
are (checked with boto3 against the moto server), the agents carry ``--runtime-env`` to their jobs,
and one agent killed by pid is reported while the stack keeps running. Runs after the lifecycle
scenarios (file order within the group); the session's teardown then checks Ctrl-C exits 0."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import boto3
import pytest
from stack_helpers import AGENTS, RUNTIME_ENV, wait_for

pytestmark = [pytest.mark.xdist_group("e2e-stack"), pytest.mark.slow]


def test_stack_lists_agents_and_resources(devstack):
    state, log = devstack["state"], devstack["log"]
    manifest = json.loads((state / "stack.json").read_text())
    banner = log.read_text()
    agents = manifest["agents"]
    assert [a["node_id"] for a in agents] == [f"dev-node-{i}" for i in range(1, AGENTS + 1)]
    for a in agents:
        assert a["pool"] == "onprem-a" and a["device"] == "cpu"
        assert Path(a["log"]).parent == state.resolve() / "logs" and Path(a["log"]).is_file()
        os.kill(a["pid"], 0)  # alive
        assert f"agent {a['node_id']}" in banner and f"pid {a['pid']}" in banner and a["log"] in banner
    assert len({a["pid"] for a in agents}) == len({a["log"] for a in agents}) == AGENTS

    # the agents hand --runtime-env to their jobs (the agent's child_env setting), never the IMDS endpoint
    environ = dict(
        item.split("=", 1) for item in Path(f"/proc/{agents[0]['pid']}/environ").read_text().split("\0") if item
    )
    # ... plus, where podman runs, the tenant-container settings the stack adds for container jobs
    containers = {"GPUFLEET_OCI_USER", "GPUFLEET_JOBS_DIR", "GPUFLEET_GANG_NETWORK"}
    child = json.loads(environ["GPUFLEET_AGENT_CHILD_ENV"])
    # ... and the stack's published models (its ModelsRoot output), as an operator's agent.toml names them
    assert child.pop("GPUFLEET_MODEL_S3_ROOT") == manifest["aws"]["outputs"]["ModelsRoot"]
    for given in (child, manifest["runtime_env"]):
        assert {k: v for k, v in given.items() if k not in containers} == RUNTIME_ENV
        assert set(given) - set(RUNTIME_ENV) in (set(), containers)
    assert manifest["imds_endpoint"] == devstack["imds"].endpoint

    aws = manifest["aws"]
    session = dict(region_name=aws["region"], endpoint_url=aws["endpoint_url"],
                   aws_access_key_id=aws["access_key_id"], aws_secret_access_key=aws["secret_access_key"])
    ddb = boto3.client("dynamodb", **session)
    for a in agents:
        item = ddb.get_item(TableName=aws["tables"]["control"],
                            Key={"pk": {"S": f"NODE#{a['node_id']}"}, "sk": {"S": "NODE"}})["Item"]
        assert item["pool"]["S"] == "onprem-a"
    assert set(aws["tables"]) == {"jobs", "control", "ledger"}
    for name in aws["tables"].values():
        ddb.describe_table(TableName=name)
    s3 = boto3.client("s3", **session)
    for name in aws["buckets"].values():
        s3.head_bucket(Bucket=name)
    sfn = boto3.client("stepfunctions", **session)
    assert sfn.describe_state_machine(stateMachineArn=aws["state_machine_arn"])["status"] == "ACTIVE"
    assert manifest["api"]["profile"] == str(state.resolve() / "profile.json")
    assert (manifest["moto_endpoint"], manifest["region"], manifest["tables"], manifest["buckets"],
            manifest["state_machine_arn"]) == (aws["endpoint_url"], aws["region"], aws["tables"],
                                               aws["buckets"], aws["state_machine_arn"])


def test_stack_survives_one_agent_killed(devstack):
    """Last test of the session: kill one agent by pid; it is reported once and the stack keeps running."""
    manifest = json.loads((devstack["state"] / "stack.json").read_text())
    victim, *others = reversed(manifest["agents"])
    os.kill(victim["pid"], signal.SIGKILL)
    log = devstack["log"]
    wait_for(lambda: f"warning: agent {victim['node_id']}" in log.read_text(), 15, 0.25, "the warning")
    time.sleep(2)
    assert devstack["stack"].proc.poll() is None, log.read_text()[-4000:]
    for a in others:
        os.kill(a["pid"], 0)
    assert log.read_text().count("warning: agent") == 1
