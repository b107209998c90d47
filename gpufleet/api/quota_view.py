"""Quota tree and pool views for the API, read through the scheduler's modules.

Contract:
- :func:`levels` returns the tenant, team and user levels of the caller: ``path``,
  ``level``, ``configured`` (a quota node exists), ``limits`` (GPU type → milli,
  ``*`` = all types; guarantee + borrowing limit), ``usage`` (GPU type → milli in
  use, ``all`` = every type), and the node's ``guarantee``, ``borrow_limit`` and
  ``weight`` maps. Items are the scheduler's ``QUOTA#<path>`` nodes
  (written by gpufleet/store/quotas.py and gpufleet/store/placements.py); this module only reads them.
- :func:`pools` returns each configured pool (``ApiSettings.pools``, from ``GPUFLEET_POOLS``, overlaid by
  operators' pool documents as the scheduler sees them)
  with its capacity now: for on-prem pools the live (heartbeat not expired, not
  draining) nodes, their GPUs and free GPUs (capped by ``max_gpus``); for cloud
  pools ``max_gpus`` and the GPUs in use from the scheduler's pool counter. Both come from the control
  table's directory index (``DIR#NODES``, ``DIR#USAGE``; :func:`gpufleet.store.snapshot.load_capacity`),
  never a Scan.
"""

from __future__ import annotations

from typing import Any

from gpufleet.clock import Clock
from gpufleet.pools import Pool
from gpufleet.store.principals import Principal
from gpufleet.store.quotas import read_quota_nodes
from gpufleet.store.snapshot import load_capacity
from gpufleet.tables import TableNames

MILLI = 1000


def _numbers(m: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (m or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def level_view(level: str, path: str, node: dict[str, Any] | None) -> dict[str, Any]:
    """One level of the tree from a stored quota node (pure)."""
    node = node or {}
    usage = {
        k[len("used_") :]: float(v)
        for k, v in node.items()
        if k.startswith("used_") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return {
        "path": path,
        "level": level,
        "configured": bool(node),
        "limits": _numbers(node.get("limits")),
        "usage": usage,
        "guarantee": _numbers(node.get("guarantee")),
        "borrow_limit": _numbers(node.get("borrow_limit")),
        "weight": _numbers(node.get("weight")),
    }


def levels(client, table: str, who: Principal) -> list[dict[str, Any]]:
    paths = [
        ("tenant", who.tenant),
        ("team", f"{who.tenant}/{who.team}"),
        ("user", f"{who.tenant}/{who.team}/{who.user}"),
    ]
    nodes = read_quota_nodes(client, table, [p for _, p in paths])
    return [level_view(level, path, nodes.get(path)) for level, path in paths]


def pools(client, tables: TableNames, clock: Clock, configured: tuple[Pool, ...]) -> list[dict[str, Any]]:
    now = clock.now()
    snap = load_capacity(client, tables, configured, now)
    out = []
    for p in snap.pools:
        view = p.model_dump(mode="json")
        if p.kind.is_cloud:
            used = snap.pool_used.get(p.name, 0) / MILLI
            view["capacity"] = {"gpus_total": p.max_gpus, "gpus_in_use": used, "gpus_free": max(0.0, p.max_gpus - used)}
        else:
            live = [n for n in snap.nodes if n.pool == p.name and n.usable(now)]
            total = min(p.max_gpus, sum(len(n.gpu_free) for n in live))
            free = min(total, sum(sum(n.gpu_free) for n in live) / MILLI)
            view["capacity"] = {"nodes": len(live), "gpus_total": total, "gpus_free": free}
        out.append(view)
    return out
