"""``gpufleet pools``: the pools jobs can be placed on, with their capacity and price."""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pools", help="list pools and their capacity")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pools = make_client(args).pools()
    if args.json:
        print_json(pools)
        return EXIT_OK
    rows = []
    for p in pools:
        cap = (p.model_extra or {}).get("capacity") or {}
        free, total = cap.get("gpus_free"), cap.get("gpus_total")
        gpus = f"{free:g}/{total:g}" if isinstance(free, int | float) and isinstance(total, int | float) else ""
        rows.append(
            (
                p.name,
                p.kind or "",
                p.gpu_type or "",
                "" if cap.get("nodes") is None else cap["nodes"],
                gpus,
                "" if p.max_gpus is None else f"{p.max_gpus:g}",
                "" if p.price_per_gpu_hour is None else f"{p.price_per_gpu_hour:g}",
            )
        )
    print(table(rows, ["POOL", "KIND", "GPU", "NODES", "FREE/TOTAL", "MAX GPUS", "USD/GPU-H"]) if rows else "no pools")
    return EXIT_OK
