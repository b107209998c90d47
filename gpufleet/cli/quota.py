"""``gpufleet quota``: the caller's quota and usage up the tenant → team → user tree."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quota", help="show your quota and usage")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def render(data: Any, indent: int = 0) -> list[str]:
    """Nested quota documents as indented ``key: value`` lines (pure)."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, dict | list) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(render(value, indent + 1))
            else:
                lines.append(f"{pad}{key}: {json.dumps(value) if not isinstance(value, str) else value}")
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, dict):
                lines.append(f"{pad}-")
                lines.extend(render(item, indent + 1))
            else:
                lines.append(f"{pad}- {item}")
    return lines


def _pairs(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in sorted(values.items()))


def describe(data: dict[str, Any]) -> str:
    """The quota document as text: the tree levels as a table, then the soft queued-jobs limits (pure)."""
    levels = data.get("levels")
    if not isinstance(levels, list):
        return "\n".join(render(data)) or "no quota configured"
    rows = [
        (lv.get("level", ""), lv.get("path", ""), _pairs(lv.get("limits") or {}), _pairs(lv.get("usage") or {}))
        for lv in levels
    ]
    out = [table(rows, ["LEVEL", "PATH", "LIMITS", "USAGE"]) if rows else "no quota levels configured"]
    queued = data.get("queued") or {}
    if queued:
        out.append(
            f"queued jobs: user {queued.get('user')}/{queued.get('user_limit')}, team {queued.get('team')}/{queued.get('team_limit')}"
        )
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    quota = make_client(args).quota()
    if args.json:
        print_json(quota)
    else:
        print(describe(quota.model_dump(mode="json")))
    return EXIT_OK
