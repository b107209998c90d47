"""``gpufleet ls``: the caller's jobs, newest first, as a table (``--all`` follows the cursor)."""

from __future__ import annotations

import argparse

from gpufleet.cli.common import (
    EXIT_OK,
    add_connection_args,
    add_json_arg,
    describe_workload,
    make_client,
    print_json,
    progress_text,
    table,
)
from gpufleet.status import JobStatus


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list jobs (newest first)")
    p.add_argument("--status", type=str.upper, choices=[s.value for s in JobStatus], help="only jobs in this status")
    p.add_argument("--limit", type=int, default=20, help="how many jobs to show (default 20)")
    p.add_argument("--all", action="store_true", help="every matching job, following the cursor")
    p.add_argument("--created-after", metavar="ISO")
    p.add_argument("--created-before", metavar="ISO")
    p.add_argument("--array", dest="array_id", help="only this job array's elements")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="only jobs with this label")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = make_client(args)
    labels = dict(v.partition("=")[::2] for v in args.label) or None
    filters = {"status": args.status, "created_after": args.created_after, "created_before": args.created_before,
               "array_id": args.array_id, "labels": labels}
    page_size = max(1, min(args.limit, 100))
    jobs = list(client.iter_jobs(max_items=None if args.all else args.limit, page_size=page_size, **filters))
    if args.json:
        print_json(jobs)
        return EXIT_OK
    if not jobs:
        print("no jobs")
        return EXIT_OK
    rows = [(j.job_id, j.status.value, j.created_at or "", progress_text(j), describe_workload(j)) for j in jobs]
    print(table(rows, ["JOB", "STATUS", "CREATED", "STEP", "WORKLOAD"]))
    return EXIT_OK
