"""``gpufleet deliveries JOB``: the job's webhook delivery log, one row per try, oldest first.

Exit 0 (also when nothing was delivered yet), 1 for an unknown job or a refused request,
2 when the service cannot be reached; errors are one line on stderr (see :mod:`gpufleet.cli.main`).
"""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table
from gpufleet.sdk_models import Delivery

HEADERS = ("TIME", "EVENT", "ATTEMPT", "STATUS", "DELIVERED", "NEXT RETRY")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deliveries", help="show a job's webhook delivery log")
    p.add_argument("job_id")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def delivery_row(d: Delivery) -> tuple[str, str, str, str, str, str]:
    """The table cells of one try (pure): status 0 reads ``no response``; a final failure
    reads ``dead-lettered`` under NEXT RETRY."""
    if d.status_code is None:
        status = ""
    else:
        status = str(d.status_code) if d.status_code else "no response"
    delivered = "" if d.delivered is None else ("yes" if d.delivered else "no")
    next_retry = d.next_retry_at or ("dead-lettered" if d.dead_lettered else "")
    attempt = "" if d.attempt is None else str(d.attempt)
    return (d.at or "", d.event_type or "", attempt, status, delivered, next_retry)


def deliveries_table(deliveries: list[Delivery]) -> str:
    return table([delivery_row(d) for d in deliveries], HEADERS)


def run(args: argparse.Namespace) -> int:
    deliveries = make_client(args).deliveries(args.job_id)
    if args.json:
        print_json(deliveries)
    elif not deliveries:
        print("no webhook deliveries")
    else:
        print(deliveries_table(deliveries))
    return EXIT_OK
