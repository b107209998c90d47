"""Helpers shared by the CLI commands: client construction, output formats, exit codes.

Exit codes (documented in README.md, "CLI"):

==== =========================================================================
0    success
1    the request was refused or invalid (4xx, a bad spec file, bad arguments)
2    the service could not be reached or failed (5xx, connection errors)
3    ``--wait``: the job ended, but not SUCCEEDED (FAILED, REJECTED, BLOCKED, ...)
4    ``output``: the video failed verification (C2PA not trusted or no watermark)
124  ``--wait``/``logs -f``: the timeout passed before the job ended
130  interrupted (Ctrl-C)
==== =========================================================================
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from pydantic import BaseModel

from gpufleet.sdk_models import Job

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_SERVICE = 2
EXIT_JOB_UNSUCCESSFUL = 3
EXIT_VERIFY_FAILED = 4
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """``--profile`` and ``--endpoint`` (see :mod:`gpufleet.profile` for the resolution order)."""
    p.add_argument("--profile", metavar="FILE", help="profile file (default: ./.gpufleet/profile.json, then ~)")
    p.add_argument("--endpoint", metavar="URL", help="API endpoint (overrides the profile)")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def make_client(args: argparse.Namespace):
    """A :class:`gpufleet.Client` from ``--profile`` / ``--endpoint`` (imported lazily).

    ``--endpoint`` without any profile signs with botocore's credential chain.
    """
    from gpufleet.errors import ConfigError
    from gpufleet.profile import load_profile
    from gpufleet.sdk import Client

    endpoint = getattr(args, "endpoint", None)
    profile_path = getattr(args, "profile", None)
    try:
        profile = load_profile(profile_path)
    except ConfigError:
        if not endpoint or profile_path:
            raise
        return Client(endpoint)
    if endpoint:
        profile = profile.model_copy(update={"endpoint": endpoint.rstrip("/")})
    return Client(profile=profile)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list | tuple):
        return [to_jsonable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    return obj


def print_json(obj: Any, out: TextIO | None = None) -> None:
    print(json.dumps(to_jsonable(obj), indent=2, sort_keys=True, default=str), file=out or sys.stdout)


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain text table with left-aligned columns (pure)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def short(text: str | None, width: int = 40) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_workload(job: Job) -> str:
    workload = job.workload
    if workload.get("kind") == "container":
        return short(f"{workload.get('image', '')} {' '.join(workload.get('command') or [])}")
    return short(workload.get("prompt"))


def progress_text(job: Job) -> str:
    if job.progress and job.progress.total:
        return f"{job.progress.step}/{job.progress.total}"
    return ""


def progress_bar(job: Job, width: int = 24) -> str:
    """One line: status, a bar of the denoising step, and ``step k/N`` (pure)."""
    frac = job.progress.fraction if job.progress else 0.0
    if job.status.value in ("FINALIZING", "SUCCEEDED"):
        frac = 1.0
    filled = int(round(frac * width))
    bar = "#" * filled + "-" * (width - filled)
    step = f" step {progress_text(job)}" if progress_text(job) else ""
    return f"{job.job_id}  {job.status.value:<11} [{bar}]{step}"


class ProgressPrinter:
    """Prints a progress line to ``stream`` whenever it changes; redraws in place on a TTY."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.last = ""
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, job: Job) -> None:
        line = progress_bar(job)
        if line == self.last:
            return
        self.last = line
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if job.is_terminal else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def operator_client(args: argparse.Namespace, service: str, endpoint_url: str | None):
    """A boto3 client of ``service`` with the operator's own credentials: the gpufleet profile's (``--profile``) when
    one resolves, else botocore's chain; ``--region``; ``endpoint_url`` (None: ``$AWS_ENDPOINT_URL`` or AWS)."""
    import boto3

    from gpufleet.errors import ConfigError
    from gpufleet.profile import load_profile
    from gpufleet.store.clients import botocore_session, client

    try:
        profile = load_profile(args.profile)
    except ConfigError:
        if args.profile:
            raise
        profile = None
    # a session of its own (a named profile's credentials) that shares the process's parsed service models
    own = botocore_session(profile=profile.aws_profile) if profile and profile.aws_profile else botocore_session()
    session = boto3.Session(botocore_session=own)
    kw = {}
    if profile and profile.access_key_id and profile.secret_access_key:
        kw = {"aws_access_key_id": profile.access_key_id, "aws_secret_access_key": profile.secret_access_key,
              "aws_session_token": profile.session_token}
    region = args.region or (profile.region if profile else None)
    return client(service, region=region, endpoint_url=endpoint_url or None, credentials=kw, session=session)
