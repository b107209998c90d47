"""``gpufleet costs [--by tenant|team|user|label|pool] [--label-key K] [--since ISO] [--until ISO] [--csv]``.

The caller's tenant's costs from the billing ledger (``GET /v1/costs``), charged and waived apart;
``--tenant`` (operators) names another tenant. ``--csv`` prints the server's CSV, ``--json`` the report.
"""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("costs", help="costs from the billing ledger, grouped (charged and waived apart)")
    p.add_argument("--by", choices=["tenant", "team", "user", "label", "pool"], default="tenant")
    p.add_argument("--label-key", help="with --by label: the label whose values group the costs")
    p.add_argument("--since", metavar="ISO", help="inclusive, e.g. 2026-01-01T00:00:00Z")
    p.add_argument("--until", metavar="ISO", help="exclusive")
    p.add_argument("--tenant", help="operators: another tenant")
    p.add_argument("--csv", action="store_true", help="print CSV")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = make_client(args)
    kw = {"by": args.by, "since": args.since, "until": args.until, "label_key": args.label_key, "tenant": args.tenant}
    if args.csv:
        print(client.costs(**kw, csv=True), end="")
        return EXIT_OK
    rep = client.costs(**kw)
    if args.json:
        print_json(rep)
        return EXIT_OK
    rows = [(g["key"], g["charged_usd"], g["charged_attempts"], g["waived_usd"], g["waived_attempts"])
            for g in [*rep["groups"], rep["total"]]]
    print(table(rows, [args.by.upper(), "CHARGED_USD", "CHARGED", "WAIVED_USD", "WAIVED"]))
    return EXIT_OK
