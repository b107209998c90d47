"""`--check` (python -m onprem_agent and `gpufleet agent`): exit 0 healthy, 1 unhealthy, 2 bad config."""

from __future__ import annotations

import json
import os
import time

import tomli_w

from gpufleet.cli.main import main as gpufleet_main
from onprem_agent.main import main as agent_main


def _config(fleet, tmp_path, **overrides):
    settings = fleet.agent("node-h", **overrides).settings
    path = tmp_path / "check.toml"
    path.write_text(tomli_w.dumps({"agent": settings}))
    return path, settings


def _report(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_check_exit_codes(fleet, tmp_path, capsys, monkeypatch):
    cfg, settings = _config(fleet, tmp_path)
    for k, v in fleet.node_env("node-h").items():  # the node's own credentials reach the node API as node-h
        monkeypatch.setenv(k, v)
    assert agent_main(["--check", "--config", str(cfg)]) == 0
    rep = _report(capsys)
    assert rep["healthy"] is True
    assert {"settings", "state_dir", "cache_dir", "accelerators", "queue", "node_api"} <= set(rep["checks"])
    assert rep["checks"]["accelerators"]["detail"].startswith("cpu: 1 device")

    # the same through the gpufleet CLI
    assert gpufleet_main(["agent", "--check", "--config", str(cfg)]) == 0
    assert _report(capsys)["healthy"] is True

    # a queue that does not exist (wrong URL, or credentials without access) → unhealthy
    bad_queue, _ = _config(fleet, tmp_path, queue_url=fleet.node_queue("node-h") + "-missing")
    assert agent_main(["--check", "--config", str(bad_queue)]) == 1
    rep = _report(capsys)
    assert rep["checks"]["queue"]["ok"] is False and rep["checks"]["node_api"]["ok"] is True

    # an agent running on this state dir whose heartbeat went stale → unhealthy
    state = tmp_path / "live-state"
    live, _ = _config(fleet, tmp_path, state_dir=str(state))
    state.mkdir()
    (state / "agent.pid").write_text(str(os.getpid()))
    (state / "status.json").write_text(json.dumps({"heartbeat_at": time.time() - 3600}))
    assert agent_main(["--check", "--config", str(live)]) == 1
    assert _report(capsys)["checks"]["agent_heartbeat"]["ok"] is False
    (state / "status.json").write_text(json.dumps({"heartbeat_at": time.time()}))
    assert agent_main(["--check", "--config", str(live)]) == 0
    capsys.readouterr()

    # invalid settings → 2, with the reason
    broken = tmp_path / "broken.toml"
    broken.write_text(tomli_w.dumps({"agent": {**settings, "poll_wait_s": 99}}))
    assert agent_main(["--check", "--config", str(broken)]) == 2
    rep = _report(capsys)
    assert rep["healthy"] is False and "poll_wait_s" in rep["checks"]["settings"]["detail"]
