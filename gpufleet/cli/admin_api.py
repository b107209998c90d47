"""``gpufleet admin tenant|team|user|quota|pool|node|audit``: operator commands over the administration API.

Each command is one signed request to ``/v1/admin/...`` (or ``POST /v1/nodes`` for ``node register``) with
the operator's profile (``--profile``/``--endpoint``, as every API command); the API refuses callers that are
not admin principals (403) and audits every change. Quota amounts are given in GPUs (``A100=2``, ``*=0.5``)
and sent as milli-GPUs. Writes are conditional: ``--expected-version`` names the version read (0: must not
exist yet); a lost race is a 409 and exit 1.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json, table
from gpufleet.errors import ValidationFailed

ADMIN = "/v1/admin"


def _pairs(values: list[str], what: str, convert=float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise ValidationFailed(f"{what}: expected TYPE=VALUE, got {raw!r}")
        try:
            out[key.strip()] = convert(value)
        except ValueError:
            raise ValidationFailed(f"{what}: {value!r} is not a number")
    return out


def gpus_to_milli(values: list[str], what: str) -> dict[str, int]:
    """``["A100=2", "*=0.5"]`` → ``{"A100": 2000, "*": 500}`` (pure)."""
    return {k: int(round(v * 1000)) for k, v in _pairs(values, what).items()}


def _labels(values: list[str]) -> dict[str, str]:
    return {k: str(v) for k, v in _pairs(values, "--label", str).items()}


def _sub(parent: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    p = parent.add_parser(name, help=help_text, description=help_text)
    add_connection_args(p)
    add_json_arg(p)
    return p


def register(asub: argparse._SubParsersAction) -> None:  # noqa: PLR0915 - one parser per command
    tenant = asub.add_parser("tenant", help="tenants (administration API)").add_subparsers(dest="a", required=True)
    p = _sub(tenant, "create", "onboard a tenant")
    p.add_argument("tenant")
    p.add_argument("--display-name", default="")
    p.add_argument("--placement-policy", choices=["cost", "latency", "locality"])
    p.set_defaults(func=lambda a: _call(a, "POST", f"{ADMIN}/tenants", body=_drop({
        "tenant": a.tenant, "display_name": a.display_name, "placement_policy": a.placement_policy})))
    p = _sub(tenant, "list", "list tenants")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/tenants", columns=("tenant", "display_name",
                                                                              "placement_policy", "version")))
    p = _sub(tenant, "get", "show a tenant")
    p.add_argument("tenant")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/tenants/{a.tenant}"))
    p = _sub(tenant, "update", "change a tenant's display name or default placement policy")
    p.add_argument("tenant")
    p.add_argument("--display-name")
    p.add_argument("--placement-policy", choices=["cost", "latency", "locality"])
    p.add_argument("--expected-version", type=int)
    p.set_defaults(func=lambda a: _call(a, "PATCH", f"{ADMIN}/tenants/{a.tenant}", body=_drop({
        "display_name": a.display_name, "placement_policy": a.placement_policy,
        "expected_version": a.expected_version})))

    team = asub.add_parser("team", help="teams of a tenant (administration API)").add_subparsers(dest="a", required=True)
    p = _sub(team, "create", "create a team")
    p.add_argument("tenant")
    p.add_argument("team")
    p.set_defaults(func=lambda a: _call(a, "POST", f"{ADMIN}/tenants/{a.tenant}/teams", body={"team": a.team}))
    p = _sub(team, "list", "list a tenant's teams")
    p.add_argument("tenant")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/tenants/{a.tenant}/teams", columns=("team", "created_at")))

    user = asub.add_parser("user", help="users: IAM principal → tenant/team/user (administration API)")
    user = user.add_subparsers(dest="a", required=True)
    p = _sub(user, "add", "map an IAM principal ARN to a user of a team")
    p.add_argument("tenant")
    p.add_argument("--team", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--arn", required=True, help="IAM user, role or assumed-role session ARN")
    p.add_argument("--admin", action="store_true", help="an operator (may call the administration API)")
    p.set_defaults(func=lambda a: _call(a, "POST", f"{ADMIN}/tenants/{a.tenant}/users", body={
        "arn": a.arn, "team": a.team, "user": a.user, "admin": a.admin}))
    p = _sub(user, "list", "list a tenant's users")
    p.add_argument("tenant")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/tenants/{a.tenant}/users",
                                        columns=("team", "user", "arn", "admin")))
    p = _sub(user, "remove", "remove a user's principal")
    p.add_argument("tenant")
    p.add_argument("--arn", required=True)
    p.set_defaults(func=lambda a: _call(a, "DELETE", f"{ADMIN}/tenants/{a.tenant}/users", query={"arn": a.arn}))

    quota = asub.add_parser("quota", help="the quota tree (administration API)").add_subparsers(dest="a", required=True)
    p = _sub(quota, "get", "show a quota node")
    p.add_argument("path", help="tenant, tenant/team or tenant/team/user")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/quota", query={"path": a.path}))
    p = _sub(quota, "set", "set a quota node (the whole node: maps left out are emptied)")
    p.add_argument("path", help="tenant, tenant/team or tenant/team/user")
    p.add_argument("--guarantee", action="append", default=[], metavar="TYPE=GPUS", help="e.g. A100=2 or '*=1'")
    p.add_argument("--borrow", action="append", default=[], metavar="TYPE=GPUS", help="may borrow above the guarantee")
    p.add_argument("--weight", action="append", default=[], metavar="TYPE=W", help="fair-share weight")
    p.add_argument("--expected-version", type=int)
    p.set_defaults(func=lambda a: _call(a, "PUT", f"{ADMIN}/quota", query={"path": a.path}, body=_drop({
        "guarantee": gpus_to_milli(a.guarantee, "--guarantee"), "borrow_limit": gpus_to_milli(a.borrow, "--borrow"),
        "weight": _pairs(a.weight, "--weight"), "expected_version": a.expected_version})))

    pool = asub.add_parser("pool", help="pools (administration API)").add_subparsers(dest="a", required=True)
    p = _sub(pool, "list", "pools: the deployment's, overlaid by operators' definitions")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/pools", columns=("name", "kind", "region", "gpu_type",
                                                                            "max_gpus", "price_per_gpu_hour")))
    p = _sub(pool, "set", "add an on-prem pool, or change a pool's capacity and prices")
    p.add_argument("name")
    p.add_argument("--kind", default="onprem", choices=["onprem", "spot", "ondemand"])
    p.add_argument("--region", required=True, help="cloud region or on-prem site")
    p.add_argument("--gpu-type", required=True)
    p.add_argument("--max-gpus", type=int, required=True)
    p.add_argument("--price-per-gpu-hour", type=float, default=0.0)
    p.add_argument("--expected-version", type=int)
    p.set_defaults(func=lambda a: _call(a, "PUT", f"{ADMIN}/pools/{a.name}", body=_drop({
        "kind": a.kind, "region": a.region, "gpu_type": a.gpu_type, "max_gpus": a.max_gpus,
        "price_per_gpu_hour": a.price_per_gpu_hour, "expected_version": a.expected_version})))
    p = _sub(pool, "delete", "remove an operator's pool definition")
    p.add_argument("name")
    p.set_defaults(func=lambda a: _call(a, "DELETE", f"{ADMIN}/pools/{a.name}"))

    node = asub.add_parser("node", help="nodes (administration API)").add_subparsers(dest="a", required=True)
    p = _sub(node, "list", "registered nodes")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/nodes", columns=("node_id", "pool", "site", "gpu_type",
                                                                            "gpus", "drained")))
    p = _sub(node, "get", "a node's registration")
    p.add_argument("node_id")
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/nodes/{a.node_id}"))
    p = _sub(node, "register", "register a node and bind it to a pool (POST /v1/nodes; creates its queues)")
    p.add_argument("node_id")
    p.add_argument("--pool", required=True)
    p.add_argument("--site", default="")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu-type", default="cpu")
    p.add_argument("--gpu-memory-gb", type=float, default=0)
    p.add_argument("--cpu-milli", type=int, default=0)
    p.add_argument("--memory-mib", type=int, default=0)
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--agent-config", metavar="PATH", default=None,
                   help="also write the node's agent.toml (its queue, the node API, region, tables, labels) to PATH "
                        "(a new file: an existing one is not replaced)")
    p.set_defaults(func=_register_node)
    p = _sub(node, "bind", "bind a registered node to another pool")
    p.add_argument("node_id")
    p.add_argument("--pool", required=True)
    p.set_defaults(func=lambda a: _call(a, "PUT", f"{ADMIN}/nodes/{a.node_id}/pool", body={"pool": a.pool}))
    for verb in ("drain", "undrain"):
        p = _sub(node, verb, f"{verb} a node ({'no new placements; running jobs finish' if verb == 'drain' else 'place again'})")
        p.add_argument("node_id")
        p.set_defaults(func=lambda a, v=verb: _call(a, "POST", f"{ADMIN}/nodes/{a.node_id}/{v}"))
    p = _sub(node, "deregister", "remove a node from the fleet: no placements, its node API calls refused "
             "(refused while it holds attempts, unless --force)")
    p.add_argument("node_id")
    p.add_argument("--force", action="store_true",
                   help="also while it holds attempts: they end at their heartbeat timeout and are placed again")
    p.add_argument("--expected-version", type=int, default=None)
    p.set_defaults(func=lambda a: _call(a, "DELETE", f"{ADMIN}/nodes/{a.node_id}", query={
        **({"force": "true"} if a.force else {}),
        **({"expected_version": a.expected_version} if a.expected_version is not None else {})}))

    p = _sub(asub, "audit", "administration changes of a month, newest first")
    p.add_argument("--month", help="yyyy-mm (default: this month)")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=lambda a: _call(a, "GET", f"{ADMIN}/audit", query=_drop({"month": a.month, "limit": a.limit}),
                                        columns=("at", "actor", "action", "target")))


def _drop(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def render(body: Any, columns: tuple[str, ...] | None) -> str:
    """A listing as a table (``columns``), any other document as ``key: value`` lines (pure)."""
    if columns and isinstance(body, dict) and isinstance(body.get("items"), list):
        rows = [[_cell(i.get(c)) for c in columns] for i in body["items"]]
        return table(rows, [c.upper() for c in columns]) if rows else "(none)"
    if body is None:
        return "(none)"
    if isinstance(body, dict):
        return "\n".join(f"{k}: {_cell(v)}" for k, v in sorted(body.items()))
    return str(body)


def _cell(v: Any) -> str:
    if isinstance(v, dict):
        return " ".join(f"{k}={x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else f"{k}={x}"
                        for k, x in sorted(v.items()))
    return "" if v is None else str(v)


def _register_node(a: argparse.Namespace) -> int:
    """``node register``: ``POST /v1/nodes``; with ``--agent-config``, the node's ``agent.toml`` beside it."""
    from gpufleet.cli import agent_config

    if a.agent_config and os.path.exists(a.agent_config):  # refused before anything is registered
        raise ValidationFailed(f"{a.agent_config} exists: not replaced (edit it, or write the new one elsewhere)")
    client = make_client(a)
    resp = client.request("POST", "/v1/nodes", body={
        "node_id": a.node_id, "pool": a.pool, "site": a.site, "gpus": a.gpus, "gpu_type": a.gpu_type,
        "gpu_memory_gb": a.gpu_memory_gb, "cpu_milli": a.cpu_milli, "memory_mib": a.memory_mib,
        "labels": _labels(a.label)})
    body = dict(resp.body)
    if a.agent_config:
        written = agent_config.write(a.agent_config, agent_config.render(body.get("agent") or {}, client.endpoint))
        body["agent_config"] = str(written)
    if a.json:
        print_json(body)
    else:
        print(render({k: v for k, v in body.items() if k != "agent"}))
    return EXIT_OK


def _call(args: argparse.Namespace, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None,
          columns: tuple[str, ...] | None = None) -> int:
    resp = make_client(args).request(method, path, query=query, body=body)
    if args.json:
        print_json(resp.body)
    else:
        print(render(resp.body, columns))
    return EXIT_OK
