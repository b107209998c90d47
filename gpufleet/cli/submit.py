"""``gpufleet submit``: submit a text-to-video prompt or a spec file (JSON or TOML).

``gpufleet submit "a red fox running in snow" --steps 10 --wait`` builds a ``video.generate``
spec from the prompt and options; ``gpufleet submit -f job.json`` sends a full JobSpec. The
spec is validated locally first: an invalid file gives one line naming the field, exit 1.
With ``--wait`` a progress line (status and denoising step) is drawn on stderr until the job
ends; the exit code is 0 only if it SUCCEEDED (3 otherwise, 124 on ``--timeout``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.cli.common import (
    EXIT_JOB_UNSUCCESSFUL,
    EXIT_OK,
    EXIT_TIMEOUT,
    ProgressPrinter,
    add_connection_args,
    add_json_arg,
    make_client,
    print_json,
)
from gpufleet.errors import ValidationFailed, WaitTimeout
from gpufleet.sdk import spec_error_line
from gpufleet.spec import JobSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a job (a prompt or a spec file)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", nargs="?", help="text-to-video prompt (omit when using -f)")
    p.add_argument("-f", "--file", metavar="SPEC", help="job spec file (.json or .toml); '-' reads JSON from stdin")
    p.add_argument("--negative-prompt")
    p.add_argument("--model")
    p.add_argument("--frames", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--guidance", type=float)
    p.add_argument("--gpus", type=float, help="GPUs per node (fractions below 1 share a GPU)")
    p.add_argument("--gpu-type")
    p.add_argument("--priority", type=int)
    p.add_argument("--policy", choices=["cost", "latency", "locality"], help="placement policy")
    p.add_argument("--pool", action="append", default=[], metavar="NAME",
                   help="only place the job on this pool (repeatable; names as 'gpufleet pools' lists them)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--max-run-seconds", type=int, metavar="S",
                   help="the longest one attempt may run; past it the job ends FAILED (TIMED_OUT)")
    p.add_argument("--deadline", metavar="ISO", help="a job not started by then ends EXPIRED (RFC 3339 with timezone)")
    p.add_argument("--idempotency-key", help="reuse a key to make a retried submission safe (default: random)")
    p.add_argument("--wait", action="store_true", help="wait for the job to end, showing progress")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait with --wait (default 600)")
    add_json_arg(p)
    add_connection_args(p)
    p.set_defaults(func=run)


def read_spec_file(path: str) -> dict[str, Any]:
    """Parse a spec file; raise :class:`ValidationFailed` with one line on any problem."""
    try:
        if path == "-":
            text = sys.stdin.read()
            return _as_object(json.loads(text), path)
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ValidationFailed(f"spec file {path} does not exist")
    except json.JSONDecodeError as err:
        raise ValidationFailed(f"spec from stdin is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})")
    except OSError as err:
        raise ValidationFailed(f"cannot read spec file {path}: {err.strerror}")
    if path.endswith(".toml"):
        try:
            return _as_object(tomllib.loads(raw.decode()), path)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ValidationFailed(f"spec file {path} is not valid TOML: {' '.join(str(err).split())}")
    try:
        return _as_object(json.loads(raw), path)
    except json.JSONDecodeError as err:
        raise ValidationFailed(f"spec file {path} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})")
    except UnicodeDecodeError:
        raise ValidationFailed(f"spec file {path} is not UTF-8 text")


def _as_object(data: Any, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValidationFailed(f"spec file {path} must hold an object (a JobSpec), not {type(data).__name__}")
    return data


def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec document described by the command line (pure)."""
    if args.file and args.prompt:
        raise ValidationFailed("give either a prompt or -f SPEC, not both")
    if args.file:
        spec = read_spec_file(args.file)
    elif args.prompt:
        spec = {"workload": {"kind": "video.generate", "prompt": args.prompt}}
    else:
        raise ValidationFailed("nothing to submit: give a prompt or -f SPEC")
    workload = spec.get("workload")
    if workload is None:
        workload = spec["workload"] = {}
    if not isinstance(workload, dict):
        raise ValidationFailed("invalid job spec: workload: must be an object")
    for name in ("negative_prompt", "model", "frames", "width", "height", "steps", "seed", "guidance"):
        value = getattr(args, name)
        if value is not None:
            workload[name] = value
    resources = {"gpus": args.gpus, "gpu_type": args.gpu_type}
    if any(v is not None for v in resources.values()):
        spec.setdefault("resources", {}).update({k: v for k, v in resources.items() if v is not None})
    if args.priority is not None:
        spec["priority"] = args.priority
    if args.policy:
        spec["placement_policy"] = args.policy
    if args.pool:
        spec["pools"] = list(dict.fromkeys(args.pool))
    if getattr(args, "max_run_seconds", None) is not None:
        spec["max_run_seconds"] = args.max_run_seconds
    if getattr(args, "deadline", None):
        spec["deadline"] = args.deadline
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValidationFailed(f"--label expects KEY=VALUE, got {item!r}")
        spec.setdefault("labels", {})[key] = value
    return spec


def run(args: argparse.Namespace) -> int:
    try:
        spec = JobSpec.model_validate(spec_from_args(args))
    except ValidationError as err:
        raise ValidationFailed(spec_error_line(err))
    client = make_client(args)
    job = client.submit(spec, idempotency_key=args.idempotency_key)
    if not args.wait:
        if args.json:
            print_json(job)
        else:
            print(f"{job.job_id}  {job.status.value}")
        return EXIT_OK
    if not args.json:
        print(f"submitted {job.job_id}")
    try:
        job = client.wait(job.job_id, timeout=args.timeout, on_update=None if args.json else ProgressPrinter())
    except WaitTimeout as err:
        print(f"gpufleet: {err.detail}", file=sys.stderr)
        return EXIT_TIMEOUT
    if args.json:
        print_json(job)
    else:
        print(f"{job.job_id} {job.status.value}")
    return EXIT_OK if job.status.value == "SUCCEEDED" else EXIT_JOB_UNSUCCESSFUL
