"""How a gang's member containers reach each other (pure): the site's gang_network plan per rank, joining rank 0's
namespace (waiting for it, giving up, stopping), per-rank container names, and non-gang jobs left alone."""

from __future__ import annotations

import pytest

from gpufleet.errors import ConfigError
from gpufleet.gang import GangRole
from gpufleet.runtime import gangnet, oci
from gpufleet.runtime.settings import RuntimeSettings


def _role(rank: int) -> GangRole:
    return GangRole(rank=rank, world_size=2, nodes=["n0", "n1"], master_addr="n0", master_port=29501)


@pytest.mark.parametrize("setting", ["none", "local", "host"])
def test_a_job_that_is_no_gang_keeps_the_nodes_network_whatever_the_setting(setting):
    assert gangnet.plan(setting, None, "none") == gangnet.MemberNetwork("none")
    assert gangnet.plan(setting, None, "slirp4netns") == gangnet.MemberNetwork("slirp4netns")


def test_none_gives_members_the_nodes_network_and_the_gang_contracts_master_addr():
    for rank in (0, 1):
        assert gangnet.plan("none", _role(rank), "slirp4netns") == gangnet.MemberNetwork("slirp4netns", {})


def test_local_rank0_owns_a_loopback_only_namespace_that_the_others_join():
    lo = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert gangnet.plan("local", _role(0), "slirp4netns") == gangnet.MemberNetwork("none", lo)  # never egress
    assert gangnet.plan("local", _role(1), "none") == gangnet.MemberNetwork(None, lo)


def test_host_shares_the_hosts_network_and_keeps_rank0s_node_id():
    assert gangnet.plan("host", _role(1), "none") == gangnet.MemberNetwork("host", {})


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += s

    def monotonic(self) -> float:
        return self.t


def test_join_waits_until_rank0_runs_and_returns_its_namespace():
    clock, asked = _Clock(), []

    def running_pid(name: str) -> int | None:
        asked.append(name)
        return 4242 if clock.t >= 1.0 else None

    got = gangnet.join_rank0(running_pid, "gpufleet-j-e0003-r0", lambda: False, clock.sleep, clock.monotonic)
    assert got == ("ns:/proc/4242/ns/net", 4242)
    assert set(asked) == {"gpufleet-j-e0003-r0"} and len(asked) == 5  # 0, 0.25, 0.5, 0.75, 1.0


def test_join_gives_up_after_the_timeout_or_when_the_attempt_is_stopped():
    clock = _Clock()
    assert gangnet.join_rank0(lambda n: None, "r0", lambda: False, clock.sleep, clock.monotonic, timeout_s=3) is None
    assert 3 <= clock.t < 3.5
    clock, polls = _Clock(), []
    stopped = lambda: clock.t >= 1.0  # noqa: E731 - e.g. fenced while waiting
    assert gangnet.join_rank0(lambda n: polls.append(n), "r0", stopped, clock.sleep, clock.monotonic) is None
    assert clock.t == 1.0 and len(polls) == 4


def test_the_member_must_sit_in_rank0s_namespace_once_it_runs():
    assert gangnet.same_namespace("net:[4026532184]", "net:[4026532184]")
    assert not gangnet.same_namespace("net:[4026532184]", "net:[4026532999]")  # rank 0's pid was reused
    assert gangnet.same_namespace("net:[4026532184]", None)  # the member already ended: nothing to judge


def test_members_have_their_own_container_and_the_joined_namespace_keeps_every_other_isolation_flag():
    assert oci.container_name("job_x", 3, 1) == "gpufleet-job_x-e0003-r1"
    assert oci.container_name("job_x", 3, 0) != oci.container_name("job_x", 3)
    spec = oci.ContainerSpec(name="n", image="i", command=["c"], env={}, uid=10001, mounts=[],
                             network=gangnet.netns_of(99))
    head = oci.run_argv(spec)
    assert head[head.index("--network") + 1] == "ns:/proc/99/ns/net"
    for flag in ("--read-only", "--no-hosts"):
        assert flag in head
    assert head[head.index("--cap-drop") + 1] == "all" and head[head.index("--pid") + 1] == "private"


def test_the_setting_defaults_to_none_and_refuses_other_values():
    assert RuntimeSettings.load({}).gang_network == "none"
    assert RuntimeSettings.load({"GPUFLEET_GANG_NETWORK": "local"}).gang_network == "local"
    with pytest.raises(ConfigError, match="gang_network"):
        RuntimeSettings.load({"GPUFLEET_GANG_NETWORK": "bridge"})
