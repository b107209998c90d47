"""``gpufleet dev --agents 2`` in its own process: both nodes register in the on-prem pool, the
ready banner and ``stack.json`` list both agents (node id, pid, log) and where moto and its
resources are (checked with boto3 against the moto server), the agents carry ``--runtime-env``
to their jobs, one agent killed by pid is reported while the stack keeps running, and Ctrl-C
still stops everything with exit 0 and removes ``stack.json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

pytestmark = [pytest.mark.xdist_group("cli-dev-stack"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 240  # a cold CDK synth (first run after a source change) takes minutes on a busy machine
RUNTIME_ENV = {"GPUFLEET_PROGRESS_INTERVAL_S": "0.3", "GPUFLEET_CHECKPOINT_EVERY_STEPS": "2"}


def _wait_for(predicate, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:g}s:\n{log.read_text()[-4000:]}")
        time.sleep(0.25)


def test_two_agents_registered_listed_and_survivable(tmp_path):
    state = tmp_path / "state"
    out_path = tmp_path / "dev.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUFLEET_", "MOTO_"))}
    argv = [sys.executable, "-m", "gpufleet.cli.main", "dev", "--state-dir", str(state), "--port", "0",
            "--device", "cpu", "--agents", "2", "--heartbeat-seconds", "5",
            "--imds-endpoint", "http://127.0.0.1:9"]
    for k, v in RUNTIME_ENV.items():
        argv += ["--runtime-env", f"{k}={v}"]
    with open(out_path, "w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: "gpufleet dev: ready" in out_path.read_text() or proc.poll() is not None,
                  READY_TIMEOUT_S, "gpufleet dev was not ready", out_path)
        assert proc.poll() is None, out_path.read_text()[-4000:]
        banner = out_path.read_text()
        manifest = json.loads((state / "stack.json").read_text())

        agents = manifest["agents"]
        assert [a["node_id"] for a in agents] == ["dev-node-1", "dev-node-2"]
        for a in agents:
            assert a["pool"] == "onprem-a" and a["device"] == "cpu"
            assert Path(a["log"]).parent == state.resolve() / "logs" and Path(a["log"]).is_file()
            os.kill(a["pid"], 0)  # alive
            assert f"agent {a['node_id']}" in banner and f"pid {a['pid']}" in banner and a["log"] in banner
        assert len({a["pid"] for a in agents}) == 2 and len({a["log"] for a in agents}) == 2

        # the agents hand --runtime-env to their jobs (the agent's child_env setting)
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{agents[0]['pid']}/environ").read_text().split("\0") if item
        )
        assert json.loads(environ["GPUFLEET_AGENT_CHILD_ENV"]) == RUNTIME_ENV
        assert "GPUFLEET_IMDS_ENDPOINT" not in environ["GPUFLEET_AGENT_CHILD_ENV"]
        assert manifest["runtime_env"] == RUNTIME_ENV and manifest["imds_endpoint"] == "http://127.0.0.1:9"

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

        # kill one agent by pid: reported once, the stack keeps running on the other
        os.kill(agents[1]["pid"], signal.SIGKILL)
        _wait_for(lambda: "warning: agent dev-node-2" in out_path.read_text(), 15, "no warning", out_path)
        time.sleep(2)
        assert proc.poll() is None, out_path.read_text()[-4000:]
        os.kill(agents[0]["pid"], 0)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"gpufleet dev did not stop within 60 s of Ctrl-C:\n{out_path.read_text()[-4000:]}")
    text = out_path.read_text()
    assert code == 0, text[-4000:]
    assert text.count("warning: agent") == 1 and "gpufleet dev: stopped" in text
    assert not (state / "stack.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(agents[0]["pid"], 0)
