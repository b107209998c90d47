"""``gpufleet cancel JOB``: request cancellation (idempotent; exit 1 if the job already ended)."""

from __future__ import annotations

import argparse

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job_id")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    job = make_client(args).cancel(args.job_id)
    if args.json:
        print_json(job)
    else:
        print(f"cancellation requested for {job.job_id} (status {job.status.value})")
    return EXIT_OK
