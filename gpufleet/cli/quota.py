"""``gpufleet quota``: the caller's quota and usage up the tenant → team → user tree."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json


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


def run(args: argparse.Namespace) -> int:
    quota = make_client(args).quota()
    if args.json:
        print_json(quota)
    else:
        print("\n".join(render(quota.model_dump(mode="json"))) or "no quota configured")
    return EXIT_OK
