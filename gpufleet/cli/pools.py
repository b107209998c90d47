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
        extra = p.model_extra or {}
        free = extra.get("free_gpus", extra.get("gpus_free", ""))
        rows.append(
            (
                p.name,
                p.kind or "",
                p.gpu_type or "",
                p.max_gpus if p.max_gpus is not None else "",
                free,
                p.price_per_gpu_hour if p.price_per_gpu_hour is not None else "",
            )
        )
    print(table(rows, ["POOL", "KIND", "GPU", "MAX GPUS", "FREE", "USD/GPU-H"]) if rows else "no pools")
    return EXIT_OK
