"""``gpufleet diagnose [--pool P] [--since 1h|ISO] [--until ISO] [--json] [--html out/report.html]``: operators.

Where the window's GPU time went (``GET /v1/admin/diagnose``): every GPU-second given to one cause, the lost causes
ranked by GPU-hours with the likely fix (docs/operations.md, "Diagnosing low GPU utilisation"). ``--since`` takes a
duration back from now (``90s``, ``30m``, ``1h``, ``2d``) or an RFC 3339 time; ``--html`` also writes a
self-contained page with the attribution chart and a per-GPU timeline (:mod:`gpufleet.diagnose.report`).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json
from gpufleet.clock import iso
from gpufleet.errors import ValidationFailed

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_arg(value: str | None, now: float) -> str | None:
    """``--since``: a duration back from ``now`` (``1h``) becomes an RFC 3339 time; anything else is passed on."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if m:
        return iso(now - float(m.group(1)) * _UNITS[m.group(2)])
    if re.fullmatch(r"\d.*[T ].*", value.strip()):
        return value.strip()
    raise ValidationFailed(f"--since takes a duration (30m, 1h, 2d) or an RFC 3339 time, got {value!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="operators: where the GPU time went, lost causes ranked, with likely fixes")
    p.add_argument("--pool", help="only this pool's nodes")
    p.add_argument("--since", default="1h", help="a duration back from now (30m, 1h, 2d) or RFC 3339; default 1h")
    p.add_argument("--until", metavar="ISO", help="the window's end (default: now)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (chart and timeline)")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.diagnose.attribution import from_dict
    from gpufleet.diagnose.report import html_page, text_table

    client = make_client(args)
    doc = client.diagnose(since=since_arg(args.since, time.time()), until=args.until, pool=args.pool,
                          lanes=bool(args.html))
    if args.html:
        out = Path(args.html)
        out.parent.mkdir(parents=True, exist_ok=True)
        title = f"gpufleet diagnose{f' --pool {args.pool}' if args.pool else ''}"
        out.write_text(html_page(from_dict(doc), title))
    if args.json:
        print_json({k: v for k, v in doc.items() if k != "lanes"})
        return EXIT_OK
    print(text_table(doc))
    if args.html:
        print(f"\nwrote {args.html}")
    return EXIT_OK
