"""``gpufleet logs JOB [-f]``: the runtime's log lines; ``-f`` follows until the job ends."""

from __future__ import annotations

import argparse
import json
import sys

from gpufleet.cli.common import EXIT_OK, EXIT_TIMEOUT, add_connection_args, add_json_arg, make_client
from gpufleet.errors import WaitTimeout
from gpufleet.sdk_models import LogLine


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="print a job's log lines")
    p.add_argument("job_id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    p.add_argument("--timeout", type=float, default=None, help="stop following after this many seconds")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def format_line(line: LogLine) -> str:
    epoch = f" e{line.epoch}" if line.epoch is not None else ""
    return f"{line.ts or ''} {(line.level or '').upper():<5}{epoch} {line.msg}".strip()


def run(args: argparse.Namespace) -> int:
    client = make_client(args)
    emit = (
        (lambda ln: print(json.dumps(ln.model_dump(mode="json"), sort_keys=True)))
        if args.json
        else (lambda ln: print(format_line(ln)))
    )
    if not args.follow:
        after = None
        while True:
            page = client.logs(args.job_id, after=after)
            for line in page.lines:
                emit(line)
            if not page.lines or not page.next or page.next == after:
                return EXIT_OK
            after = page.next
    try:
        for line in client.follow_logs(args.job_id, timeout=args.timeout):
            emit(line)
            sys.stdout.flush()
    except WaitTimeout as err:
        print(f"gpufleet: {err.detail}", file=sys.stderr)
        return EXIT_TIMEOUT
    return EXIT_OK
