"""``gpufleet webhooks endpoints create|list|get|enable|disable|delete`` and ``gpufleet webhooks secrets [--rotate]``.

Tenant self-service (docs/api.md "Webhook endpoints", "Webhook signing secrets"): endpoints receive the
events of every job of the caller's tenant that match their ``--event`` kinds and ``--label`` selector;
the secrets are what receivers verify deliveries with. Every sub-command takes ``--json``; an error is one
line on stderr and a non-zero exit (:mod:`gpufleet.cli.main`).
"""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table
from gpufleet.errors import ValidationFailed

EVENTS = ("started", "progress", "completed")


def _common(p: argparse.ArgumentParser) -> None:
    add_json_arg(p)
    add_connection_args(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("webhooks", help="the tenant's webhook endpoints and signing secrets")
    kinds = p.add_subparsers(dest="webhooks_command", required=True)
    ep = kinds.add_parser("endpoints", help="endpoints that receive the tenant's job events")
    ops = ep.add_subparsers(dest="endpoints_command", required=True)

    c = ops.add_parser("create", help="register an endpoint")
    c.add_argument("url", help="https URL (the same policy as a job's webhook url)")
    c.add_argument("--event", action="append", choices=EVENTS, default=[], dest="events",
                   help="a job event to receive (repeat; default: completed)")
    c.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="only jobs carrying this label (repeat to require several)")
    c.add_argument("--description", help="a note for humans")
    _common(c)
    c.set_defaults(func=run_create)

    ls = ops.add_parser("list", help="the tenant's endpoints")
    _common(ls)
    ls.set_defaults(func=run_list)

    for name, func, text in (("get", run_get, "one endpoint"), ("delete", run_delete, "delete an endpoint"),
                             ("enable", run_enable, "enable an endpoint"),
                             ("disable", run_disable, "disable an endpoint (it receives nothing meanwhile)")):
        q = ops.add_parser(name, help=text)
        q.add_argument("endpoint_id", metavar="ENDPOINT", help="we_<id>")
        _common(q)
        q.set_defaults(func=func)

    s = kinds.add_parser("secrets", help="the signing secrets deliveries carry signatures of")
    s.add_argument("--rotate", action="store_true", help="make a new current secret")
    s.add_argument("--overlap-seconds", type=int, metavar="S",
                   help="with --rotate: how long the previous secret keeps signing (default one day)")
    _common(s)
    s.set_defaults(func=run_secrets)


def parse_labels(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a dict (pure)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValidationFailed(f"--label expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def render(endpoints: list[dict[str, Any]]) -> str:
    """The endpoints as a table (pure)."""
    rows = [(e["id"], "yes" if e["enabled"] else "no", ",".join(e["events"]),
             ",".join(f"{k}={v}" for k, v in sorted((e.get("labels") or {}).items())) or "*", e["url"])
            for e in endpoints]
    return table(rows, ["ID", "ENABLED", "EVENTS", "LABELS", "URL"])


def _show(args: argparse.Namespace, endpoint: dict[str, Any]) -> int:
    if args.json:
        print_json(endpoint)
    else:
        print(render([endpoint]))
    return EXIT_OK


def run_create(args: argparse.Namespace) -> int:
    labels = parse_labels(args.label)
    ep = make_client(args).create_webhook_endpoint(args.url, events=list(dict.fromkeys(args.events)) or None,
                                                   description=args.description, labels=labels or None)
    return _show(args, ep)


def run_list(args: argparse.Namespace) -> int:
    found = list(make_client(args).iter_webhook_endpoints())
    if args.json:
        print_json(found)
    elif found:
        print(render(found))
    else:
        print("no webhook endpoints")
    return EXIT_OK


def run_get(args: argparse.Namespace) -> int:
    return _show(args, make_client(args).webhook_endpoint(args.endpoint_id))


def run_enable(args: argparse.Namespace) -> int:
    return _show(args, make_client(args).set_webhook_endpoint_enabled(args.endpoint_id, True))


def run_disable(args: argparse.Namespace) -> int:
    return _show(args, make_client(args).set_webhook_endpoint_enabled(args.endpoint_id, False))


def run_delete(args: argparse.Namespace) -> int:
    make_client(args).delete_webhook_endpoint(args.endpoint_id)
    if args.json:
        print_json({"id": args.endpoint_id, "deleted": True})
    else:
        print(f"deleted {args.endpoint_id}")
    return EXIT_OK


def run_secrets(args: argparse.Namespace) -> int:
    if args.overlap_seconds is not None and not args.rotate:
        raise ValidationFailed("--overlap-seconds goes with --rotate")
    got = make_client(args).webhook_secrets(rotate=args.rotate, overlap_seconds=args.overlap_seconds)
    if args.json:
        print_json(got)
        return EXIT_OK
    rows = [(s["id"], "current" if s["current"] else f"until {s['expires_at']}", s["secret"]) for s in got["secrets"]]
    print(table(rows, ["ID", "SIGNS", "SECRET"]))
    return EXIT_OK
