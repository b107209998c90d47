"""Settings of the embedded stack (``gpufleet dev`` options): agents, runtime env, IMDS endpoint,
heartbeat; the agents' health rule; what the cloud runner gives every Batch job."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gpufleet.cli.dev import settings_from_args
from gpufleet.cli.main import build_parser
from gpufleet.devstack.components import AgentProcess
from gpufleet.devstack.settings import DevSettings, load, parse_assignments, runtime_setting_names
from gpufleet.devstack.stack import AgentFleet, CloudRunner
from gpufleet.errors import ConfigError
from gpufleet.local.batch_runner import BatchRunner
from gpufleet.runtime.settings import RuntimeSettings


def dev_args(*argv: str) -> DevSettings:
    return settings_from_args(build_parser().parse_args(["dev", *argv]))


def test_defaults_are_one_agent_on_the_default_node():
    s = dev_args()
    assert (s.agents, s.node_ids(), s.runtime_env, s.imds_endpoint, s.heartbeat_seconds) == (
        1, ["dev-node-1"], {}, None, 20,
    )


def test_agents_run_warm_workers_unless_told_not_to():
    assert dev_args().warm_workers is True
    assert dev_args("--no-warm-workers").warm_workers is False


@pytest.mark.parametrize(
    ("node_id", "agents", "expected"),
    [
        ("dev-node-1", 3, ["dev-node-1", "dev-node-2", "dev-node-3"]),
        ("gpu-box", 2, ["gpu-box-1", "gpu-box-2"]),
        ("gpu-box-17", 2, ["gpu-box-1", "gpu-box-2"]),
        ("gpu-box-17", 1, ["gpu-box-17"]),
    ],
)
def test_node_ids(node_id, agents, expected):
    assert load(node_id=node_id, agents=agents).node_ids() == expected


@pytest.mark.parametrize("n", [0, 9, -1])
def test_agents_out_of_range_is_a_config_error(n):
    with pytest.raises(ConfigError, match="agents"):
        dev_args("--agents", str(n))


def test_heartbeat_accepts_5_and_refuses_4():
    from gpufleet.finalize_route import LAMBDA_MAX_PIXELS

    # the dev stack routes finalize by the deployment default unless told (LOCAL_CONTEXT's bound is test-sized)
    assert dev_args("--heartbeat-seconds", "5").cdk_context() == {"gpufleet:heartbeat_seconds": 5,
                                                                  "gpufleet:cloud_heartbeat_seconds": 30,
                                                                  "gpufleet:finalize_lambda_max_pixels": LAMBDA_MAX_PIXELS}
    assert dev_args("--finalize-lambda-max-pixels", "7").cdk_context()["gpufleet:finalize_lambda_max_pixels"] == 7
    with pytest.raises(ConfigError, match="heartbeat_seconds"):
        dev_args("--heartbeat-seconds", "4")


def test_runtime_env_is_repeatable_and_kept():
    s = dev_args(
        "--runtime-env", "GPUFLEET_PROGRESS_INTERVAL_S=0.3", "--runtime-env", "GPUFLEET_CHECKPOINT_EVERY_STEPS=2"
    )
    assert s.runtime_env == {"GPUFLEET_PROGRESS_INTERVAL_S": "0.3", "GPUFLEET_CHECKPOINT_EVERY_STEPS": "2"}


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ("GPUFLEET_NOT_A_SETTING=1", "GPUFLEET_NOT_A_SETTING is not a runtime setting"),
        ("PROGRESS_INTERVAL_S=1", "PROGRESS_INTERVAL_S is not a runtime setting"),
        ("GPUFLEET_PROGRESS_INTERVAL_S=fast", "GPUFLEET_PROGRESS_INTERVAL_S='fast'"),
        ("GPUFLEET_CHECKPOINT_EVERY_STEPS=-1", "GPUFLEET_CHECKPOINT_EVERY_STEPS"),
        ("GPUFLEET_IMDS_ENDPOINT=http://127.0.0.1:1", "use --imds-endpoint"),
        ("GPUFLEET_STATE_DIR=/tmp/x", "cannot be set here"),
        ("GPUFLEET_PROGRESS_INTERVAL_S", "KEY=VALUE"),
        ("=1", "KEY=VALUE"),
    ],
)
def test_bad_runtime_env_is_a_one_line_config_error(item, match):
    with pytest.raises(ConfigError, match=match) as err:
        dev_args("--runtime-env", item)
    assert "\n" not in err.value.detail


def test_every_accepted_runtime_env_name_is_a_runtime_setting():
    fields = {f"GPUFLEET_{n.upper()}" for n in RuntimeSettings.model_fields}
    assert set(runtime_setting_names()) == fields
    assert load(runtime_env={"GPUFLEET_TORCH_THREADS": "2"}).runtime_env == {"GPUFLEET_TORCH_THREADS": "2"}


def test_parse_assignments_keeps_equals_signs_in_values_and_the_last_key_wins():
    assert parse_assignments(["A=b=c", "A=d", "E="]) == {"A": "d", "E": ""}


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8999", "http://localhost:8999/", "http://[::1]:80", "http://127.0.0.2"]
)
def test_imds_endpoint_on_loopback_is_accepted(url):
    assert dev_args("--imds-endpoint", url).imds_endpoint == url.rstrip("/")


@pytest.mark.parametrize(
    "url", ["https://127.0.0.1:8999", "http://169.254.169.254", "http://example.com", "127.0.0.1:8999",
            "http://127.0.0.1:99999"]
)
def test_imds_endpoint_off_loopback_or_not_http_is_refused(url):
    with pytest.raises(ConfigError, match="imds_endpoint"):
        dev_args("--imds-endpoint", url)


def test_cloud_runner_gives_runtime_env_to_every_batch_job_and_imds_to_spot_ones():
    runner = BatchRunner(lambda job: (0, None), base_env={"AWS_REGION": "us-east-1"})
    part = CloudRunner(SimpleNamespace(batch_runner=runner), {"GPUFLEET_SPOT_POLL_S": "0.5"}, "http://127.0.0.1:9")
    part.start()
    assert runner.base_env == {"AWS_REGION": "us-east-1", "GPUFLEET_SPOT_POLL_S": "0.5"}
    assert runner.queue_env == {"gpufleet-gpu-spot": {"GPUFLEET_IMDS_ENDPOINT": "http://127.0.0.1:9"}}

    def job_on(queue: str):
        definition = SimpleNamespace(name="gpufleet-gpu", container_properties={"command": ["python"], "environment": []},
                                     timeout=None)
        return SimpleNamespace(job_id="j", job_name="n", job_queue=SimpleNamespace(name=queue), stop=False,
                               job_definition=definition, container_overrides={})

    assert runner.local_job(job_on("gpufleet-gpu-spot")).environment["GPUFLEET_IMDS_ENDPOINT"] == "http://127.0.0.1:9"
    assert "GPUFLEET_IMDS_ENDPOINT" not in runner.local_job(job_on("gpufleet-gpu-ondemand")).environment
    assert "GPUFLEET_IMDS_ENDPOINT=http://127.0.0.1:9 (spot queues)" in part.describe()["cloud pool runner"]


def _agent_running(tmp_path, node_id: str) -> AgentProcess:
    """An AgentProcess whose process is a real sleeping child (its health is what is under test)."""
    agent = AgentProcess(node_id, {}, tmp_path / f"{node_id}.log", lambda: True, device="cpu", grace_s=5)
    agent.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    agent.pid = agent.proc.pid
    return agent


def _wait_exit(agent: AgentProcess) -> None:
    deadline = time.monotonic() + 10
    while agent.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_one_agent_of_two_exiting_is_a_notice_once_and_the_last_one_a_problem(tmp_path):
    a, b = _agent_running(tmp_path, "n-1"), _agent_running(tmp_path, "n-2")
    fleet = AgentFleet(None, [a, b])
    try:
        assert fleet.notices() == [] and fleet.problem() is None
        b.proc.kill()
        _wait_exit(b)
        notices = fleet.notices()
        assert len(notices) == 1 and f"agent n-2 (pid {b.pid}) exited with code -9" in notices[0]
        assert fleet.notices() == [] and fleet.problem() is None  # reported once; one agent still runs
        assert [r["pid"] for r in fleet.records()] == [a.pid, b.pid]
        a.proc.kill()
        _wait_exit(a)
        assert fleet.problem().startswith("every agent exited")
    finally:
        fleet.stop()


def test_stop_continues_a_paused_agent_so_it_can_drain(tmp_path):
    import signal

    a = _agent_running(tmp_path, "n-1")
    a.proc.send_signal(signal.SIGSTOP)
    fleet = AgentFleet(None, [a])
    t0 = time.monotonic()
    fleet.stop()  # SIGTERM + SIGCONT: the sleeping child ends at once instead of after grace_s
    assert time.monotonic() - t0 < 4
    assert a.proc is None and a.pid is not None
