"""Recovery and bulk commands: ``gpufleet retry``, ``refinalize``, ``quarantine``, ``array``, ``cancel-matching``.

- ``gpufleet retry JOB`` submits an ended job again as a new job (``retry_of`` links them).
- ``gpufleet refinalize JOB [--reason R]`` (operators) reruns Finalize → Publish → Bill of a job whose
  finalize ran out of retries, from its persisted generation.
- ``gpufleet quarantine ls [--tenant T]`` / ``show JOB`` / ``release JOB`` / ``cancel JOB`` (operators):
  list and inspect quarantined jobs (attempts, classified failures, nodes, logs), re-queue one with a
  fresh failure budget, or close it out as CANCELLED.
- ``gpufleet array SPEC.json --count N`` submits N jobs from one spec, ``{index}`` substituted (one
  Idempotency-Key for every try); ``gpufleet ls --array ID`` lists them.
- ``gpufleet cancel-matching (--array ID | --label K=V ...)`` cancels every unfinished matching job.
All talk to the API (operator checks are the server's); errors are one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, short, table
from gpufleet.errors import BadRequest


def _common(p: argparse.ArgumentParser) -> None:
    add_json_arg(p)
    add_connection_args(p)


def _labels(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values or ():
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise BadRequest(f"--label {v!r} is not KEY=VALUE")
        out[k] = val
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retry", help="submit an ended job again as a new, linked job")
    p.add_argument("job_id")
    p.add_argument("--idempotency-key", help="default: a new UUID (the same one for every try)")
    _common(p)
    p.set_defaults(func=run_retry)

    p = sub.add_parser("refinalize", help="operators: rerun finalize, publish and bill of a job whose finalize failed")
    p.add_argument("job_id")
    p.add_argument("--reason")
    _common(p)
    p.set_defaults(func=lambda a: _recover(a, "refinalize"))

    q = sub.add_parser("quarantine", help="operators: quarantined jobs (list, inspect, release, cancel)")
    qs = q.add_subparsers(dest="quarantine_command", required=True)
    ls = qs.add_parser("ls", help="a tenant's quarantined jobs, newest first")
    ls.add_argument("--tenant", help="default: the operator's own tenant")
    ls.add_argument("--limit", type=int, default=50)
    _common(ls)
    ls.set_defaults(func=run_quarantined)
    show = qs.add_parser("show", help="attempts, classified failures, nodes and logs of a job")
    show.add_argument("job_id")
    _common(show)
    show.set_defaults(func=run_show)
    for action, text in (("release", "re-queue with a fresh failure budget"), ("cancel", "close out as CANCELLED")):
        a = qs.add_parser(action, help=text)
        a.add_argument("job_id")
        a.add_argument("--reason")
        _common(a)
        a.set_defaults(func=lambda args, _act=action: _recover(args, _act))

    arr = sub.add_parser("array", help="submit N jobs from one spec file ({index} substituted)")
    arr.add_argument("spec", type=Path, help="JSON job spec")
    arr.add_argument("--count", type=int, required=True)
    arr.add_argument("--placeholder", default="{index}")
    arr.add_argument("--idempotency-key", help="default: a new UUID (the same one for every try)")
    _common(arr)
    arr.set_defaults(func=run_array)

    cm = sub.add_parser("cancel-matching", help="cancel every unfinished job of an array and/or with labels")
    cm.add_argument("--array", dest="array_id")
    cm.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    _common(cm)
    cm.set_defaults(func=run_cancel_matching)


def run_retry(args: argparse.Namespace) -> int:
    job = make_client(args).retry_job(args.job_id, idempotency_key=args.idempotency_key or str(uuid.uuid4()))
    if args.json:
        print_json(job)
    else:
        print(f"{job.job_id} (retry of {args.job_id}) {job.status.value}")
    return EXIT_OK


def _recover(args: argparse.Namespace, action: str) -> int:
    job = make_client(args).recover(args.job_id, action, getattr(args, "reason", None))
    if args.json:
        print_json(job)
    else:
        print(f"{job.job_id}: {action} done; now {job.status.value}")
    return EXIT_OK


def run_quarantined(args: argparse.Namespace) -> int:
    page = make_client(args).quarantined(tenant=args.tenant, limit=max(1, min(args.limit, 100)))
    if args.json:
        print_json(page.jobs)
        return EXIT_OK
    if not page.jobs:
        print("no quarantined jobs")
        return EXIT_OK
    rows = [(j.job_id, j.owner or "", j.updated_at or "", short(str((j.model_extra or {}).get("system_failures", ""))))
            for j in page.jobs]
    print(table(rows, ["JOB", "OWNER", "SINCE", "FAILURES"]))
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    seen = make_client(args).inspect(args.job_id)
    if args.json:
        print_json(seen)
        return EXIT_OK
    job = seen["job"]
    print(f"{job['job_id']}  {job['status']}  owner {job['owner']}  epoch {job['current_epoch']}")
    print(f"crashed workers: {', '.join(seen['crashed_workers']) or '-'}; lost on nodes: "
          f"{', '.join(seen['failed_nodes']) or '-'}")
    if seen["attempts"]:
        print(table([(a["epoch"], a.get("state") or "", a.get("pool") or "", a.get("node") or "")
                     for a in seen["attempts"]], ["EPOCH", "STATE", "POOL", "NODE"]))
    for f in seen["failures"]:
        print(f"failure e{f.get('epoch')}: {f.get('class')} {f.get('action') or ''}: {short(f.get('reason'), 100)}")
    for line in seen["logs"][-20:]:
        print(f"log: {line.get('msg', '')}")
    return EXIT_OK


def run_array(args: argparse.Namespace) -> int:
    try:
        spec = json.loads(args.spec.read_text())
    except (OSError, ValueError) as err:
        raise BadRequest(f"cannot read {args.spec}: {err}") from err
    got = make_client(args).submit_array(spec, args.count, placeholder=args.placeholder,
                                         idempotency_key=args.idempotency_key or str(uuid.uuid4()))
    if args.json:
        print_json(got)
    else:
        print(f"array {got['array_id']}: {got['count']} jobs")
        for i, job_id in enumerate(got["job_ids"]):
            print(f"  [{i}] {job_id}")
    return EXIT_OK


def run_cancel_matching(args: argparse.Namespace) -> int:
    labels = _labels(args.label)
    if not args.array_id and not labels:
        raise BadRequest("give --array or --label")
    got = make_client(args).cancel_matching(array_id=args.array_id, labels=labels or None)
    if args.json:
        print_json(got)
    else:
        print(f"matched {got['matched']}, cancel requested for {len(got['cancelled'])}")
    return EXIT_OK
