"""Quota tree and pool views for the API, read through the scheduler's modules where they exist.

Contract:
- :func:`levels` returns tenant, team and user levels (``path``, ``level``,
  ``limits``, ``usage``) for the caller. Numeric attributes of a quota node
  become limits (names without a ``used_``/``usage_`` prefix) or usage; maps
  named ``limits`` and ``usage`` are taken as they are.
- :func:`pools` returns the configured pools (``gpufleet.pools``) as dicts.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpufleet.clock import Clock
from gpufleet.store.principals import Principal
from gpufleet.store.quota_read import read_quota_nodes


def _split(node: dict[str, Any] | None) -> tuple[dict[str, float], dict[str, float]]:
    limits: dict[str, float] = {}
    usage: dict[str, float] = {}
    if not node:
        return limits, usage
    for k, v in node.items():
        if k == "limits" and isinstance(v, dict):
            limits.update({n: float(x) for n, x in v.items() if isinstance(x, (int, float))})
        elif k == "usage" and isinstance(v, dict):
            usage.update({n: float(x) for n, x in v.items() if isinstance(x, (int, float))})
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            if k.startswith(("used_", "usage_")):
                usage[k.split("_", 1)[1]] = float(v)
            elif k not in ("version", "expires_at"):
                limits[k] = float(v)
    return limits, usage


def levels(client, table: str, who: Principal) -> list[dict[str, Any]]:
    paths = [
        ("tenant", who.tenant),
        ("team", f"{who.tenant}/{who.team}"),
        ("user", f"{who.tenant}/{who.team}/{who.user}"),
    ]
    nodes = read_quota_nodes(client, table, [p for _, p in paths])
    out = []
    for level, path in paths:
        limits, usage = _split(nodes.get(path))
        out.append(
            {"path": path, "level": level, "limits": limits, "usage": usage, "configured": nodes.get(path) is not None}
        )
    return out


def pools(client, table: str, clock: Clock) -> list[dict[str, Any]]:
    try:
        mod = importlib.import_module("gpufleet.pools")
    except ModuleNotFoundError as err:
        if err.name != "gpufleet.pools":
            raise
        return []
    loaded = mod.load_pools() if hasattr(mod, "load_pools") else getattr(mod, "POOLS", [])
    return [p.model_dump(mode="json") if hasattr(p, "model_dump") else dict(p) for p in loaded]
