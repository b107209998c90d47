"""The fleet as it stands now: each on-prem node's state, GPUs and models, from its liveness item (pure).

Contract:
- :func:`node_state` is ``lost`` when the node's heartbeat expired (``expires_at`` at or before ``now``, or
  missing), else ``draining`` when it drains (an operator drained it or it said so), else ``ready``. A lost node
  that drains is ``lost``: nothing is placed on it either way, and lost is what needs an operator.
- :func:`fleet_view` turns the scheduler's node items (``DIR#NODES``, built by
  :func:`gpufleet.nodeapi.liveness.node_item`) into one row per node, ordered by node id: ``node_id``, ``pool``,
  ``gpu_type``, ``state``, ``heartbeat_at``, ``expires_at``, ``gpus`` (``index``, ``memory_gb``, ``milli_free``;
  what the last heartbeat said, whatever the state), ``resident_models`` (loaded in a warm worker),
  ``cached_models`` (on local disk), ``running_jobs``, ``labels``. Items without a ``node_id`` are skipped; a
  missing field reads as empty. It never reads the node's queue URL or anything else an operator does not need.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

NodeState = Literal["ready", "draining", "lost"]


def node_state(item: Mapping[str, Any], now: float) -> NodeState:
    """``lost`` (heartbeat expired), ``draining`` or ``ready`` (module contract)."""
    try:
        expires = float(item.get("expires_at") or 0)
    except (TypeError, ValueError):
        expires = 0.0
    if expires <= now:
        return "lost"
    return "draining" if item.get("draining") else "ready"


def _gpu(g: Mapping[str, Any]) -> dict[str, Any]:
    return {"index": int(g.get("index") or 0), "memory_gb": float(g.get("memory_gb") or 0),
            "milli_free": int(g.get("milli_free") or 0)}


def fleet_view(items: Iterable[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """One row per node item, ordered by node id (module contract)."""
    rows = []
    for it in items:
        if not it.get("node_id"):
            continue
        rows.append({
            "node_id": str(it["node_id"]),
            "pool": str(it.get("pool") or ""),
            "gpu_type": str(it.get("gpu_type") or ""),
            "state": node_state(it, now),
            "heartbeat_at": it.get("heartbeat_at"),
            "expires_at": int(float(it.get("expires_at") or 0)),
            "gpus": sorted((_gpu(g) for g in it.get("gpus") or []), key=lambda g: g["index"]),
            "resident_models": sorted(str(m) for m in it.get("resident_models") or []),
            "cached_models": sorted(str(m) for m in it.get("cached_models") or []),
            "running_jobs": int(it.get("running_jobs") or 0),
            "labels": {str(k): str(v) for k, v in (it.get("labels") or {}).items()},
        })
    return sorted(rows, key=lambda r: r["node_id"])
