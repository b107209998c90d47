"""Agent settings: TOML file < environment < explicit overrides; invalid input fails at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from gpufleet.errors import ConfigError
from onprem_agent.settings import AgentSettings, load_settings

EXAMPLE = Path(__file__).resolve().parents[3] / "onprem_agent" / "packaging" / "agent.toml"


def _write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(tomli_w.dumps(doc))
    return p


BASE = {"node_id": "node-1", "pool": "onprem-a", "queue_url": "https://sqs.example/q"}


def test_file_then_env_then_overrides(tmp_path):
    p = _write(tmp_path, {"agent": {**BASE, "poll_wait_s": 5, "labels": {"site": "a"}, "cpu_slots": 2}})
    env = {"GPUFLEET_AGENT_POLL_WAIT_S": "7", "GPUFLEET_AGENT_LABELS": '{"site": "b", "rack": "r1"}', "OTHER": "x"}
    s = load_settings(p, env=env, overrides={"node_id": "node-9", "pool": None})
    assert s.poll_wait_s == 7 and s.labels == {"site": "b", "rack": "r1"}
    assert s.node_id == "node-9" and s.pool == "onprem-a" and s.cpu_slots == 2


def test_top_level_keys_work_without_an_agent_table(tmp_path):
    s = load_settings(_write(tmp_path, BASE), env={})
    assert s.node_id == "node-1" and s.state_dir == Path("/var/lib/gpufleet-agent")


@pytest.mark.parametrize(
    "doc, env, needle",
    [
        ({**BASE, "surprise": 1}, {}, "surprise"),
        ({**BASE, "poll_wait_s": 30}, {}, "poll_wait_s"),
        ({**BASE, "heartbeat_interval_s": 60, "visibility_timeout_s": 100}, {}, "visibility_timeout_s"),
        ({**BASE, "node_heartbeat_s": 60, "node_ttl_s": 30}, {}, "node_ttl_s"),
        ({**BASE, "orphan_signal": "SIGNOPE"}, {}, "unknown signal"),
        ({**BASE, "batch_max_members": 4}, {}, "needs warm_workers"),
        ({**BASE, "node_id": "bad id"}, {}, "node_id"),
        (BASE, {"GPUFLEET_AGENT_BOGUS": "1"}, "GPUFLEET_AGENT_BOGUS"),
        (BASE, {"GPUFLEET_AGENT_LABELS": "{not json"}, "must be JSON"),
        ({"pool": "p", "queue_url": "q"}, {}, "node_id"),
    ],
)
def test_invalid_settings_raise_config_error(tmp_path, doc, env, needle):
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, doc), env=env)
    assert needle in err.value.detail


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad, env={})


def test_the_packaged_example_is_valid():
    s = load_settings(EXAMPLE, env={})
    assert isinstance(s, AgentSettings)
    assert s.metrics_host == "127.0.0.1"  # metrics stay on localhost
    assert s.drain_timeout_s >= 300
