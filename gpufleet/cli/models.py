"""``gpufleet models``: the models a job may name in ``workload.model`` (built in, then the deployment's catalog)."""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the models jobs may name (built in, and the model catalog)")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models = make_client(args).models()
    if args.json:
        print_json(models)
        return EXIT_OK
    rows = [(m.name, "built in" if m.builtin else (m.source or ""), (m.content_hash or "")[:16],
             "" if m.files is None else m.files) for m in models]
    print(table(rows, ["MODEL", "SOURCE", "CONTENT HASH", "FILES"]) if rows else "no models")
    return EXIT_OK
