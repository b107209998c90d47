"""The NODE# item of docs/contracts.md, built from local facts (pure).

Contract: :func:`node_item` returns the attributes the scheduler reads —
``expires_at = floor(now) + ttl`` (epoch seconds), ``gpus`` with each device's
free milli-GPUs, ``cached_models`` the model names in the node cache and ``resident_models`` those loaded in a warm
worker now (both by the name the spec uses), ``draining`` true once the agent stops taking work (the
scheduler must not place on a draining or expired node), ``gpu_topology`` the GPUs' pairwise links
(:meth:`gpufleet.topology.Topology.code`; ``""`` when unknown: no NVML, one GPU, a failed read).
"""

from __future__ import annotations

from typing import Any

from gpufleet.clock import iso
from onprem_agent.gpus import Inventory


def node_item(
    *,
    node_id: str,
    pool: str,
    queue_url: str,
    inventory: Inventory,
    free_milli: dict[int, int],
    gpu_type: str | None,
    cpu_milli_free: int,
    memory_mib_free: int,
    labels: dict[str, str],
    cached_models: list[str],
    datasets: list[str],
    now: float,
    ttl_s: int,
    draining: bool,
    running_jobs: int,
    resident_models: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "pool": pool,
        "queue_url": queue_url,
        "gpu_type": gpu_type or inventory.gpu_type,
        "gpus": [
            {"index": d.index, "memory_gb": d.memory_gb, "milli_free": 0 if draining else int(free_milli.get(d.index, 0))}
            for d in inventory.devices
        ],
        "accelerator": inventory.kind,
        "gpu_topology": inventory.topology.code() if inventory.topology is not None else "",
        "cpu_milli_free": int(cpu_milli_free),
        "memory_mib_free": int(memory_mib_free),
        "labels": dict(labels),
        "cached_models": sorted(cached_models),
        "resident_models": sorted(resident_models or []),
        "datasets": sorted(datasets),
        "heartbeat_at": iso(now),
        "expires_at": int(now) + int(ttl_s),
        "draining": bool(draining),
        "running_jobs": int(running_jobs),
    }
