"""``gpufleet events JOB``: the job's timeline (status changes, placements, retries, billing)."""

from __future__ import annotations

import argparse
import json

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table
from gpufleet.sdk_models import Event


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("events", help="show a job's timeline")
    p.add_argument("job_id")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def event_detail(event: Event) -> str:
    """A short text for an event's detail and any extra fields (pure)."""
    parts = []
    if event.type and event.status:
        parts.append(event.status)
    if isinstance(event.detail, dict):
        parts.extend(f"{k}={_text(v)}" for k, v in sorted(event.detail.items()) if v not in (None, "", {}))
    elif event.detail not in (None, ""):
        parts.append(_text(event.detail))
    for key, value in sorted((event.model_extra or {}).items()):
        if key in {"job_id", "pk", "sk", "seq"} or value in (None, "", {}):
            continue
        parts.append(f"{key}={_text(value)}")
    return " ".join(parts)


def timeline_table(events: list[Event]) -> str:
    return table([(e.ts or "", e.label, event_detail(e)) for e in events], ["TIME", "EVENT", "DETAIL"])


def run(args: argparse.Namespace) -> int:
    events = make_client(args).events(args.job_id)
    if args.json:
        print_json(events)
    elif not events:
        print("no events")
    else:
        print(timeline_table(events))
    return EXIT_OK
