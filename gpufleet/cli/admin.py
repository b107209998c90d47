"""``gpufleet admin``: operator commands.

``tenant``, ``team``, ``user``, ``quota``, ``pool``, ``node``, ``audit`` and ``safety-profile`` call the
administration API (:mod:`gpufleet.cli.admin_api`; signed with the operator's profile, admin principals only,
every change audited with its actor).

``gpufleet admin safety-profile get|set|clear --tenant T`` reads or writes a tenant's tier-2 safety profile
through ``GET|PUT /v1/admin/tenants/{tenant}/safety-profile`` (the change is audited as ``safety.set``; the
profile records the operator's ARN as ``updated_by``).

Upgrade and bootstrap tools talk to DynamoDB through boto3, not to the gpufleet API (they need IAM rights
on the control table, an operator's, never a submitting user's): ``gpufleet admin safety-profile migrate``
moves profiles written at their old key (``TENANT#<t>`` / ``SAFETY``) to ``SAFETY#<t>``; ``gpufleet admin
directory-backfill`` lists items written before the control table's directory index existed on it
(:func:`gpufleet.store.directory.backfill`); ``gpufleet admin bootstrap`` registers the first operator
(audited with actor ``bootstrap``). ``gpufleet admin models publish`` uploads a model folder to the deployment's
models bucket with S3 (:mod:`gpufleet.cli.admin_models`). Region and credentials come from the gpufleet profile when one resolves
(``--profile``, see :mod:`gpufleet.profile`), else from botocore's chain; ``--dynamodb-endpoint`` (or
``AWS_ENDPOINT_URL``) points at another endpoint (the local moto stack); ``--table`` (or
``GPUFLEET_CONTROL_TABLE``) names the control table.
"""

from __future__ import annotations

import argparse
import os

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, operator_client, print_json
from gpufleet.errors import ValidationFailed
from gpufleet.safety.frame_selection import DEFAULT_MAX_FRAMES
from gpufleet.safety.profile import SafetyProfile, parse_thresholds

_HELP = ("operates directly on the DynamoDB control table with boto3: needs IAM rights on it; "
         "region/credentials from the gpufleet profile or botocore's chain")


def register(sub: argparse._SubParsersAction) -> None:
    admin = sub.add_parser("admin", help="operator commands (the administration API)",
                           description="operator commands: tenant, team, user, quota, pool, node, audit and "
                           "safety-profile call the administration API with your (admin) profile; models publish "
                           "writes the deployment's models bucket with your own AWS credentials; migrate, "
                           "directory-backfill and bootstrap " + _HELP)
    asub = admin.add_subparsers(dest="admin_command", required=True)
    from gpufleet.cli import admin_api

    admin_api.register(asub)
    from gpufleet.cli import admin_models

    admin_models.register(asub)
    sp_help = "a tenant's tier-2 safety profile (administration API; every change audited)"
    sp = asub.add_parser("safety-profile", help=sp_help, description=sp_help)
    ssub = sp.add_subparsers(dest="safety_command", required=True)
    get = ssub.add_parser("get", help="show the tenant's profile", description=sp_help)
    put = ssub.add_parser("set", help="write a new version of the tenant's profile (the whole profile: options left out "
                          "go back to the deployment default)", description=sp_help)
    put.add_argument("--threshold", action="append", default=[], metavar="CATEGORY=VALUE",
                     help="frame-moderation threshold in (0, 1], e.g. exposed_skin=0.03 (repeatable)")
    put.add_argument("--backend", help="moderation backend (default: the deployment's)")
    put.add_argument("--max-frames", type=int, help="frames checked per video, 2..64: a clip that long is checked whole, a longer one on "
                     f"a uniform floor plus its scene changes (default {DEFAULT_MAX_FRAMES})")
    clear = ssub.add_parser("clear", help="write a version that restores the deployment default", description=sp_help)
    for p in (put, clear):
        p.add_argument("--expected-version", type=int,
                       help="fail unless the stored version is this (default: the version stored now)")
    for p in (get, put, clear):
        p.add_argument("--tenant", required=True)
        add_connection_args(p)
        add_json_arg(p)
    migrate = ssub.add_parser("migrate", help="move profiles stored at the old key TENANT#<t>/SAFETY to SAFETY#<t> "
                              "(run once after upgrading; until then those profiles are not read)", description=_HELP)
    backfill = asub.add_parser("directory-backfill", help="list nodes, counters, allocations and quota nodes written "
                               "before the directory index existed on it (run once after upgrading)", description=_HELP)
    for p in (migrate, backfill):
        p.add_argument("--table", default=os.environ.get("GPUFLEET_CONTROL_TABLE", "gpufleet-control"),
                       help="control table (default: $GPUFLEET_CONTROL_TABLE or gpufleet-control)")
        p.add_argument("--dynamodb-endpoint", metavar="URL", help="DynamoDB endpoint (default: $AWS_ENDPOINT_URL)")
        p.add_argument("--region", help="AWS region (default: the profile's, then $AWS_REGION)")
        p.add_argument("--profile", metavar="FILE", help="gpufleet profile file for region and credentials")
        add_json_arg(p)
    boot = asub.add_parser("bootstrap", help="register the first operator (an admin principal) directly in the table",
                           description="write the first admin principal (after a deploy there is none to call the "
                           "administration API with); conditional: refused if the ARN is registered. " + _HELP)
    boot.add_argument("--arn", required=True, help="the operator's IAM user or role ARN (e.g. the AdminRoleArn output)")
    boot.add_argument("--tenant", default="ops")
    boot.add_argument("--team", default="platform")
    boot.add_argument("--user", default="operator")
    for p in (boot,):
        p.add_argument("--table", default=os.environ.get("GPUFLEET_CONTROL_TABLE", "gpufleet-control"),
                       help="control table (default: $GPUFLEET_CONTROL_TABLE or gpufleet-control)")
        p.add_argument("--dynamodb-endpoint", metavar="URL", help="DynamoDB endpoint (default: $AWS_ENDPOINT_URL)")
        p.add_argument("--region", help="AWS region (default: the profile's, then $AWS_REGION)")
        p.add_argument("--profile", metavar="FILE", help="gpufleet profile file for region and credentials")
        add_json_arg(p)
    boot.set_defaults(func=run_bootstrap)
    get.set_defaults(func=run_get)
    put.set_defaults(func=run_set)
    clear.set_defaults(func=run_clear)
    migrate.set_defaults(func=run_migrate)
    backfill.set_defaults(func=run_backfill)


def control_client(args: argparse.Namespace):
    """A boto3 DynamoDB client for the control table (see the module docstring)."""
    return operator_client(args, "dynamodb", args.dynamodb_endpoint)


def describe(profile: SafetyProfile | None, tenant: str) -> str:
    """The profile as text lines (pure)."""
    if profile is None or profile.is_default():
        head = f"tenant {tenant}: deployment default safety settings"
        return head if profile is None else f"{head} (profile version {profile.version}, cleared)"
    thresholds = " ".join(f"{k}={v:g}" for k, v in sorted(profile.frame_thresholds.items())) or "(backend defaults)"
    return "\n".join([
        f"tenant: {tenant}",
        f"version: {profile.version} (updated {profile.updated_at}{' by ' + profile.updated_by if profile.updated_by else ''})",
        f"frame thresholds: {thresholds}",
        f"backend: {profile.backend or '(deployment default)'}",
        f"max frames: {profile.max_frames or f'(default {DEFAULT_MAX_FRAMES})'}",
    ])


def _profile(doc: dict | None) -> SafetyProfile | None:
    """The administration API's profile document as a :class:`SafetyProfile` (None: never set)."""
    if not doc:
        return None
    return SafetyProfile.model_validate({k: doc[k] for k in SafetyProfile.model_fields if k in doc})


def _show(args: argparse.Namespace, doc: dict | None) -> int:
    if args.json:
        print_json(doc)
    else:
        print(describe(_profile(doc), args.tenant))
    return EXIT_OK


def _path(tenant: str) -> str:
    from gpufleet.cli.admin_api import ADMIN

    return f"{ADMIN}/tenants/{tenant}/safety-profile"


def run_get(args: argparse.Namespace) -> int:
    return _show(args, make_client(args).request("GET", _path(args.tenant)).body)


def _write(args: argparse.Namespace, thresholds: dict[str, float], backend: str | None, max_frames: int | None) -> int:
    body = {"frame_thresholds": thresholds, "backend": backend, "max_frames": max_frames,
            "expected_version": args.expected_version}
    body = {k: v for k, v in body.items() if v is not None}
    return _show(args, make_client(args).request("PUT", _path(args.tenant), body=body).body)


def run_set(args: argparse.Namespace) -> int:
    try:
        thresholds = parse_thresholds(args.threshold)
    except ValueError as err:
        raise ValidationFailed(str(err))
    if not (thresholds or args.backend or args.max_frames):
        raise ValidationFailed("give at least one --threshold, --backend or --max-frames (or use `clear`)")
    return _write(args, thresholds, args.backend, args.max_frames)


def run_clear(args: argparse.Namespace) -> int:
    return _write(args, {}, None, None)


def run_migrate(args: argparse.Namespace) -> int:
    from gpufleet.store.safety_profiles import move_legacy_profiles

    moved = move_legacy_profiles(control_client(args), args.table)
    if args.json:
        print_json({"moved": moved})
    else:
        print(f"moved {len(moved)} safety profile(s) to SAFETY#<tenant>" + (f": {', '.join(moved)}" if moved else ""))
    return EXIT_OK


def run_backfill(args: argparse.Namespace) -> int:
    from gpufleet.store.directory import backfill

    listed = backfill(control_client(args), args.table)
    if args.json:
        print_json({"listed": listed})
    else:
        print(f"listed {listed} item(s) in the control table's directory index")
    return EXIT_OK


def run_bootstrap(args: argparse.Namespace) -> int:
    """Register ``--arn`` as an admin principal with its audit record (actor ``bootstrap``)."""
    from gpufleet.adminapi.models import UserIn
    from gpufleet.clock import SystemClock, iso
    from gpufleet.ids import ulid
    from gpufleet.store.admin import AuditRecord, Change, DynamoAdminStore, Ref

    try:
        body = UserIn(arn=args.arn, team=args.team, user=args.user, admin=True)
    except ValueError as err:
        raise ValidationFailed(f"invalid operator: {err}")
    now = iso(SystemClock().now())
    attrs = {"arn": body.arn, "tenant": args.tenant, "team": body.team, "user": body.user, "admin": True,
             "created_at": now, "created_by": "bootstrap"}
    DynamoAdminStore(control_client(args), args.table).write(
        Change(Ref("principal", body.arn), attrs, expected_version=0),
        AuditRecord(at=now, id=ulid().lower(), actor="bootstrap", action="user.add", target=f"principal {body.arn}",
                    detail=attrs))
    if args.json:
        print_json(attrs)
    else:
        print(f"{body.arn}: admin principal {args.tenant}/{body.team}/{body.user}")
    return EXIT_OK
