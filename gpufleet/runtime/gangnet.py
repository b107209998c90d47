"""How the containers of one gang attempt reach each other: the site's ``gang_network`` setting.

gloo (and NCCL's bootstrap) connects every pair of ranks at addresses exchanged through the rendezvous
store, so members need addresses that route to each other. Non-gang jobs are never affected: they keep
``--network none`` (or the site's ``oci_network``).

Contract:
- :func:`plan` (pure) decides one member's network and the variables that go with it:

  - ``none`` (default): the member gets the node's ``oci_network`` like any job, and ``MASTER_ADDR`` stays
    rank 0's node id (:mod:`gpufleet.gang`). With ``oci_network`` ``none`` or ``slirp4netns`` (outbound
    NAT only) members cannot reach each other: a gang job's rendezvous fails, which the site chose.
  - ``local``: the members run on one host (several agents there: the dev stack, a test rig) and share one
    network namespace that holds nothing but loopback. Rank 0's container gets its own (``--network none``);
    every other member's container joins it (``--network ns:/proc/<pid>/ns/net``, the pid of rank 0's
    running container) — the namespace exists exactly while the attempt's containers do, and no other job
    and no outside address is in it. ``MASTER_ADDR=127.0.0.1`` and ``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` = ``lo`` (the container's hostname does not resolve: ``--no-hosts``).
  - ``host``: the host's own network (``--network host``) for members on several hosts; ``MASTER_ADDR``
    stays rank 0's node id, which must resolve to the address of its host on the interface the site
    dedicates to gang traffic (set ``GLOO_SOCKET_IFNAME`` in the job's ``env`` to that interface). The
    container then shares the host's network namespace: it can reach whatever the host can (the host's
    loopback services included) — the site gives up network isolation for gang members.
- :func:`join_rank0` is how a member other than rank 0 finds the namespace to join under ``local``: it waits
  (checking ``stopped`` between polls) until rank 0's container (:func:`gpufleet.runtime.oci.container_name`
  with rank 0) is running and returns the ``ns:`` network of its init, or None after ``timeout_s``.
  Before the member starts, the caller reads the identity of that namespace (``net:[inode]``,
  :meth:`gpufleet.runtime.oci.Podman.netns_id`); once the member's container runs, the identity of the
  member's own namespace must be the same (:func:`same_namespace`): had rank 0's pid been reused between the
  two reads, the member would sit in another process's namespace, and the caller stops it. A member whose
  namespace cannot be read any more (it already ended) is not stopped for it; rank 0 ending early (a fast
  exchange) is not a reason either — only a namespace that is provably another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gpufleet.gang import GangRole

GangNetwork = Literal["none", "local", "host"]
LOOPBACK = "127.0.0.1"
#: how long a member waits for rank 0's container to run (its image copied, its namespace made) at most
JOIN_TIMEOUT_S = 120.0
JOIN_POLL_S = 0.25


@dataclass(frozen=True)
class MemberNetwork:
    """One member's ``--network`` (None: join rank 0's namespace, :func:`join_rank0`) and the variables
    that replace or add to the gang's (:func:`gpufleet.gang.dist_env`)."""

    network: str | None
    env: dict[str, str] = field(default_factory=dict)


def plan(setting: GangNetwork, role: GangRole | None, oci_network: str) -> MemberNetwork:
    """The member's network under the site's ``gang_network`` (see module); a non-gang job: ``oci_network``."""
    if role is None or setting == "none":
        return MemberNetwork(oci_network)
    if setting == "host":
        return MemberNetwork("host")
    env = {"MASTER_ADDR": LOOPBACK, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    return MemberNetwork("none" if role.rank == 0 else None, env)


def netns_of(pid: int) -> str:
    return f"ns:/proc/{pid}/ns/net"


def join_rank0(
    running_pid: Callable[[str], int | None],
    rank0_name: str,
    stopped: Callable[[], bool],
    sleep: Callable[[float], object] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    timeout_s: float = JOIN_TIMEOUT_S,
) -> tuple[str, int] | None:
    """``(network, pid)`` of rank 0's running container, once it runs; None after ``timeout_s`` or once
    ``stopped()`` says the attempt is over."""
    deadline = monotonic() + timeout_s
    while not stopped():
        pid = running_pid(rank0_name)
        if pid is not None:
            return netns_of(pid), pid
        if monotonic() >= deadline:
            return None
        sleep(JOIN_POLL_S)
    return None


def same_namespace(expected: str, actual: str | None) -> bool:
    """False only when the member's namespace is known and is not rank 0's (module contract)."""
    return actual is None or actual == expected
