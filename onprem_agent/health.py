"""``--check``: is this agent able to work? Exit code 0 healthy, 1 unhealthy, 2 bad configuration.

Checks (each a line in the JSON report): settings valid; state and cache
directories writable; GPUs visible (or the CPU fallback, reported); the node
queue and the node API reachable with these credentials (and the node registered); and, when
an agent process is running on this state dir, that its last node heartbeat is
fresh (younger than ``node_ttl_s``).

AWS is reached only through the adapters of :mod:`onprem_agent.aws`, which turn
errors into :class:`onprem_agent.aws.Probe` outcomes; the settings, the process
environment and the clock come from the entry point.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.clock import Clock
from onprem_agent.aws import NodeApiClient, Probe, make_client, probe_node_api, probe_queue
from onprem_agent.gpus import discover
from onprem_agent.settings import AgentSettings
from onprem_agent.state import StateDir

HEALTHY, UNHEALTHY, BAD_CONFIG = 0, 1, 2


@dataclass
class HealthReport:
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks[name] = {"ok": ok, "detail": detail}

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.ok, "checks": self.checks}


def _writable(path) -> tuple[bool, str]:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".check-"):
            pass
    except OSError as err:
        return False, str(err)
    return True, str(path)


def check(
    settings: AgentSettings, *, clock: Clock, environ: Mapping[str, str], sqs=None, node_api=None
) -> HealthReport:
    rep = HealthReport()
    rep.add("settings", True, f"node {settings.node_id} in pool {settings.pool}")
    for name, path in (("state_dir", settings.state_dir), ("cache_dir", settings.cache_dir)):
        ok, detail = _writable(path)
        rep.add(name, ok, detail)
    inv = discover(settings.cpu_slots, visible=environ.get("CUDA_VISIBLE_DEVICES"))
    rep.add("accelerators", True, f"{inv.kind}: {len(inv.devices)} device(s) {inv.gpu_type}")
    region, endpoint = settings.region, settings.endpoint_url
    sqs = sqs or make_client("sqs", region, endpoint, read_timeout=10)
    if node_api is None and settings.node_api_url:
        node_api = NodeApiClient(settings.node_api_url, region, timeout=10, attempts=1)
    probes = {"queue": probe_queue(sqs, settings.queue_url),
              "node_api": probe_node_api(node_api) if node_api is not None
              else Probe(False, "node_api_url is not set")}
    for name, probe in probes.items():
        rep.add(name, probe.ok, probe.detail)
    if rep.checks["state_dir"]["ok"]:
        state = StateDir(settings.state_dir, clock)
        pid = state.live_agent_pid()
        if pid is not None:
            status = state.read_status() or {}
            age = clock.now() - float(status.get("heartbeat_at", 0))
            rep.add("agent_heartbeat", age < settings.node_ttl_s, f"pid {pid}, last node heartbeat {age:.1f}s ago")
    return rep
