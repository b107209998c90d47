"""Every tenant route of the OpenAPI document, tried by another tenant (moto, one setup for the module).

Think like an attacker holding tenant B's credentials (CAROL, t2) who learned tenant A's ids (ALICE, t1):
- every operation of ``docs/openapi.json`` whose path names a resource id is called by B on A's resources (each
  job-id operation on a QUEUED and on a SUCCEEDED job of A): B's answer must equal, byte for byte once the id is
  masked, B's answer for an id that does not exist (404 ``not-found`` for the tenant routes; the operator routes
  refuse a non-operator with 403 before reading anything, for any id), and A's resources, A's and B's job lists and
  endpoint lists are unchanged afterwards. The owner (or an operator, for the operator routes) then makes the same
  call and gets its documented answer, so B's 404 is not an accident of a wrong resource;
- the collection routes (job lists under every filter, cursors, bulk cancel, job arrays, Idempotency-Keys, costs,
  webhook endpoints and secrets, quota, pools, the provenance lookup) show B none of A's items and change none;
- every operation of the administration API (``docs/openapi-admin.json``) is refused to tenant principals (403,
  nothing read or written) and not to an operator;
- a route the document gains that is in none of the tables below fails
  :func:`test_every_documented_operation_is_covered_or_listed` (and its own parametrized case), so a new route
  cannot slip by untried.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
from api_helpers import ACCOUNT, ALICE, BOB, CAROL, REGION, SECRET, VIDEO, Caller, register_principals
from fast_moto import fast_mock_aws

from gpufleet.clock import FakeClock
from gpufleet.ids import new_job_id
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs as job_store
from gpufleet.store.objects import chunk_key
from gpufleet.store.principals import put_principal
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames, job_pk
from gpufleet.webhooks.endpoints import new_endpoint_id

OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/operator"  # ops/platform/oncall, admin: a platform operator
A, B = ALICE, CAROL  # t1/vision/alice holds the resources; t2/audio/carol attacks them
DOC = json.loads((Path(__file__).resolve().parents[3] / "docs" / "openapi.json").read_text())
METHODS = ("get", "put", "post", "delete", "patch")
URL = "https://hooks.example.com/gpufleet"


def _operations(doc: dict) -> list[tuple[str, str]]:
    return sorted((m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m in METHODS)


# ----------------------------------------------------------------------------- the tables

JOB, ENDPOINT = "job", "endpoint"


@dataclass(frozen=True)
class IdRoute:
    """How to try an id operation: the resource kind its id names, the request, B's expected (status, problem
    slug) — the same as for an unknown id — and what its owner gets on A's QUEUED/SUCCEEDED job (or endpoint)."""

    kind: str
    owner: dict[str, int]
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    refused: tuple[int, str] = (404, "not-found")
    owner_arn: str = A


ID_ROUTES: dict[tuple[str, str], IdRoute] = {
    ("GET", "/v1/jobs/{job_id}"): IdRoute(JOB, {"queued": 200, "succeeded": 200}),
    ("DELETE", "/v1/jobs/{job_id}"): IdRoute(JOB, {"queued": 202, "succeeded": 409}),
    ("GET", "/v1/jobs/{job_id}/events"): IdRoute(JOB, {"queued": 200, "succeeded": 200}),
    ("GET", "/v1/jobs/{job_id}/logs"): IdRoute(JOB, {"queued": 200, "succeeded": 200}),
    ("GET", "/v1/jobs/{job_id}/output"): IdRoute(JOB, {"queued": 409, "succeeded": 200}),
    ("GET", "/v1/jobs/{job_id}/webhooks"): IdRoute(JOB, {"queued": 200, "succeeded": 200}),
    # B uses the very key the owner then uses: B's refused try must not claim (or replay) anything
    ("POST", "/v1/jobs/{job_id}/retry"): IdRoute(JOB, {"queued": 409, "succeeded": 202},
                                                 headers={"Idempotency-Key": "retry-key-1"}),
    # Operator routes: a tenant principal is refused (403 forbidden) before anything is read, for any id, so the
    # answer says nothing about A's job either; an operator acts on any tenant's job by design (docs/api.md).
    ("GET", "/v1/admin/jobs/{job_id}"): IdRoute(JOB, {"queued": 200, "succeeded": 200}, refused=(403, "forbidden"),
                                                owner_arn=OPERATOR),
    ("POST", "/v1/admin/jobs/{job_id}/release"): IdRoute(JOB, {"queued": 409, "succeeded": 409}, body={"reason": "x"},
                                                         refused=(403, "forbidden"), owner_arn=OPERATOR),
    ("POST", "/v1/admin/jobs/{job_id}/cancel"): IdRoute(JOB, {"queued": 409, "succeeded": 409}, body={"reason": "x"},
                                                        refused=(403, "forbidden"), owner_arn=OPERATOR),
    ("POST", "/v1/admin/jobs/{job_id}/refinalize"): IdRoute(JOB, {"queued": 409, "succeeded": 409},
                                                            body={"reason": "x"}, refused=(403, "forbidden"),
                                                            owner_arn=OPERATOR),
    ("GET", "/v1/webhooks/endpoints/{endpoint_id}"): IdRoute(ENDPOINT, {"endpoint": 200}),
    ("PATCH", "/v1/webhooks/endpoints/{endpoint_id}"): IdRoute(ENDPOINT, {"endpoint": 200}, body={"enabled": False}),
    ("DELETE", "/v1/webhooks/endpoints/{endpoint_id}"): IdRoute(ENDPOINT, {"endpoint": 204}),
}

#: collection routes → the test of this module that tries them as B
COLLECTION_ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/v1/jobs"): "test_job_lists_show_b_none_of_as_jobs_under_any_filter_or_cursor",
    ("POST", "/v1/jobs"): "test_idempotency_keys_are_per_tenant",
    ("POST", "/v1/job-arrays"): "test_idempotency_keys_are_per_tenant",
    ("POST", "/v1/jobs/cancel"): "test_bulk_cancel_by_as_labels_or_array_cancels_nothing_of_as",
    ("GET", "/v1/costs"): "test_costs_show_b_none_of_as_ledger",
    ("GET", "/v1/webhooks/endpoints"): "test_webhook_endpoint_lists_and_cursors_are_per_tenant",
    ("POST", "/v1/webhooks/endpoints"): "test_webhook_endpoint_lists_and_cursors_are_per_tenant",
    ("GET", "/v1/webhooks/secrets"): "test_webhook_signing_secrets_are_per_tenant",
    ("POST", "/v1/webhooks/secrets/rotate"): "test_webhook_signing_secrets_are_per_tenant",
    ("GET", "/v1/quota"): "test_quota_and_pools_show_no_other_tenant",
    ("GET", "/v1/pools"): "test_quota_and_pools_show_no_other_tenant",
    ("GET", "/v1/models"): "test_quota_and_pools_show_no_other_tenant",
    ("POST", "/v1/provenance/lookup"): "test_provenance_lookup_gives_b_the_manifest_only",
    ("GET", "/v1/admin/quarantine"): "test_operator_collections_refuse_a_tenant",
    ("GET", "/v1/admin/diagnose"): "test_operator_collections_refuse_a_tenant",
}

#: operations no table above tries, and why
LISTED: dict[tuple[str, str], str] = {
    ("GET", "/v1/openapi.json"): "the public contract, no tenant resource: the same document for every caller "
                                 "(test_every_documented_operation_is_covered_or_listed checks A's equals B's)",
}


# ----------------------------------------------------------------------------- one moto setup for the module


@dataclass
class World:
    deps: Any
    call: Caller
    clock: FakeClock
    admin: Caller
    n: int = 0

    def key(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from gpufleet.api.app import Api
    from gpufleet.api.settings import load
    from gpufleet.api.wiring import build_deps
    from gpufleet.store.objects import s3_client

    keys = tmp_path_factory.mktemp("cross-tenant") / "watermark.keys"
    keys.write_text(("42" * 32) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_DEFAULT_REGION", REGION), ("AWS_REGION", REGION)):
            mp.setenv(name, value)
        for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "MOTO_PORT"):
            mp.delenv(name, raising=False)
        with fast_mock_aws():
            ddb = boto3.client("dynamodb", region_name=REGION)
            tables = TableNames()
            create_tables(ddb, tables)
            s3 = s3_client(REGION)
            for bucket in ("gpufleet-outputs", "gpufleet-logs"):
                s3.create_bucket(Bucket=bucket)
            kms = boto3.client("kms", region_name=REGION)
            key_arn = kms.create_key(Description="webhook secrets")["KeyMetadata"]["Arn"]
            register_principals(ddb, tables.control)
            put_principal(ddb, tables.control, OPERATOR, "ops", "platform", "oncall", admin=True)
            # tenant_rate_limit 0: the fake clock never moves, so a bucket would never refill over the module
            settings = load(cursor_secret=SECRET, idempotency_wait_s=0.2, tenant_rate_limit=0,
                            watermark_keys_file=str(keys), webhook_key_id=key_arn)
            clock = FakeClock(1_780_000_000.0)
            deps = build_deps(settings, ddb=ddb, s3=s3, clock=clock, kms=kms,
                              sfn=boto3.client("stepfunctions", region_name=REGION),
                              batch=boto3.client("batch", region_name=REGION))
            from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api

            admin = build_admin_api(AdminApiSettings(control_table=tables.control), dynamodb=ddb, clock=clock)
            yield World(deps, Caller(Api(deps)), clock, Caller(admin))


# ----------------------------------------------------------------------------- A's resources


def _submit(w: World, spec: dict | None = None, arn: str = A) -> str:
    r = w.call("POST", "/v1/jobs", spec or VIDEO, headers={"Idempotency-Key": w.key("submit")}, arn=arn)
    assert r.status == 202, r.text
    return r.json["job_id"]


def _queued_job(w: World) -> str:
    jid = _submit(w, {**VIDEO, "labels": {"exp": "isolation"}})
    _chunk(w, jid)
    return jid


def _chunk(w: World, jid: str) -> None:
    line = json.dumps({"ts": "t", "level": "INFO", "msg": "secret-of-a", "job_id": jid, "epoch": 1})
    w.deps.s3.put_object(Bucket="gpufleet-logs", Key=chunk_key(jid, 1, 1), Body=line.encode())


def _succeeded_job(w: World) -> str:
    jid = _submit(w, {**VIDEO, "labels": {"exp": "isolation"}})
    t = w.deps.settings.jobs_table
    for a, b in ((S.QUEUED, S.PENDING), (S.PENDING, S.SCHEDULED), (S.SCHEDULED, S.RUNNING), (S.RUNNING, S.FINALIZING)):
        job_store.transition(w.deps.ddb, t, jid, [a], b, {"current_epoch": 1} if a is S.QUEUED else None,
                             clock=w.clock)
    out = {"video_key": f"jobs/{jid}/video.mp4", "manifest_key": f"jobs/{jid}/video.c2pa",
           "watermark_payload": "abcdef012345"}
    job_store.transition(w.deps.ddb, t, jid, [S.FINALIZING], S.SUCCEEDED, {"output": out}, clock=w.clock)
    _chunk(w, jid)
    w.deps.ddb.put_item(TableName=t, Item={
        "pk": {"S": job_pk(jid)}, "sk": {"S": "DELIVERY#2026-01-01T00:00:00.000Z#d1"}, "delivery_id": {"S": "d1"},
        "event": {"S": "completed"}, "attempt": {"N": "1"}, "status_code": {"N": "200"}, "ok": {"BOOL": True}})
    return jid


def _endpoint(w: World) -> str:
    r = w.call("POST", "/v1/webhooks/endpoints", {"url": URL, "description": "a's endpoint"}, arn=A)
    assert r.status == 201, r.text
    return r.json["id"]


def _resources(w: World, kind: str) -> dict[str, str]:
    if kind == JOB:
        return {"queued": _queued_job(w), "succeeded": _succeeded_job(w)}
    return {"endpoint": _endpoint(w)}


def _unknown_id(w: World, kind: str) -> str:
    now = w.clock.now()
    return new_job_id(int(now * 1000)) if kind == JOB else new_endpoint_id(now)


def _snapshot(w: World, kind: str, rid: str) -> dict[str, Any]:
    """What A (and B) can see of the world around ``rid``: the resource itself and every list of both tenants."""
    c = w.call
    lists = {
        "a_jobs": c("GET", "/v1/jobs?limit=100", arn=A).json,
        "b_jobs": c("GET", "/v1/jobs?limit=100", arn=B).json,
        "a_endpoints": c("GET", "/v1/webhooks/endpoints?limit=100", arn=A).json,
        "b_endpoints": c("GET", "/v1/webhooks/endpoints?limit=100", arn=B).json,
    }
    if kind == JOB:
        item = job_store.get_job(w.deps.ddb, w.deps.settings.jobs_table, rid)
        return {**lists, "item": item, "events": c("GET", f"/v1/jobs/{rid}/events", arn=A).json,
                "deliveries": c("GET", f"/v1/jobs/{rid}/webhooks", arn=A).json,
                "logs": c("GET", f"/v1/jobs/{rid}/logs", arn=A).json}
    return {**lists, "endpoint": c("GET", f"/v1/webhooks/endpoints/{rid}", arn=A).json}


def _masked(res, rid: str) -> tuple[int, dict[str, str], Any]:
    """The response with the id it names masked (a 404 echoes the id asked for)."""
    text = res.text.replace(rid, "<id>")
    headers = {k: v.replace(rid, "<id>") for k, v in res.headers.items()}
    return res.status, headers, json.loads(text) if text else None


def _assert_problem(res, status: int, slug: str) -> None:
    assert res.status == status, res.text
    assert res.headers["content-type"] == "application/problem+json", res.headers
    assert res.json["type"].endswith("/" + slug), res.json


# ----------------------------------------------------------------------------- the id routes


def _id_ops() -> list[tuple[str, str]]:
    """The document's operations on a resource id, but those listed with a reason (LISTED)."""
    return [op for op in _operations(DOC) if "{" in op[1] and op not in LISTED]


@pytest.mark.parametrize("op", _id_ops(), ids=lambda op: f"{op[0]} {op[1]}")
def test_b_gets_on_as_resource_what_it_gets_on_an_unknown_id(world, op):
    method, template = op
    route = ID_ROUTES.get(op)
    assert route is not None, f"{method} {template} is a new id route: add it to ID_ROUTES (or LISTED with a reason)"
    w = world
    name = template[template.index("{"):template.index("}") + 1]
    for state, rid in _resources(w, route.kind).items():
        before = _snapshot(w, route.kind, rid)
        hdrs = dict(route.headers)
        got = w.call(method, template.replace(name, rid), route.body, headers=hdrs, arn=B)
        unknown = _unknown_id(w, route.kind)
        ref = w.call(method, template.replace(name, unknown), route.body, headers=hdrs, arn=B)
        _assert_problem(got, *route.refused)
        assert _masked(got, rid) == _masked(ref, unknown), (state, got.text, ref.text)
        assert _snapshot(w, route.kind, rid) == before, f"B's {method} changed A's {state} {route.kind}"
        # the owner's own call answers otherwise: B's refusal was about the tenant, not a wrong resource
        mine = w.call(method, template.replace(name, rid), route.body, headers=hdrs, arn=route.owner_arn)
        assert mine.status == route.owner[state], (state, mine.text)


@pytest.mark.parametrize("template", sorted({p for _m, p in _id_ops()}))
def test_undocumented_methods_on_as_ids_answer_like_an_unknown_id(world, template):
    """Every method the document does not give an id path (PUT on a job, POST on an endpoint...) is refused to B
    exactly as on an id that does not exist, and changes nothing."""
    documented = {m for m, p in _operations(DOC) if p == template}
    kind = ENDPOINT if "{endpoint_id}" in template else JOB
    name = template[template.index("{"):template.index("}") + 1]
    w = world
    rid = _resources(w, kind)["endpoint" if kind == ENDPOINT else "queued"]
    before = _snapshot(w, kind, rid)
    for method in (m.upper() for m in METHODS):
        if method in documented:
            continue
        got = w.call(method, template.replace(name, rid), {"enabled": False}, arn=B)
        unknown = _unknown_id(w, kind)
        ref = w.call(method, template.replace(name, unknown), {"enabled": False}, arn=B)
        assert 400 <= got.status < 500, (method, got.text)
        assert _masked(got, rid) == _masked(ref, unknown), (method, got.text, ref.text)
    assert _snapshot(w, kind, rid) == before


# ----------------------------------------------------------------------------- the collection routes


def _ids(page: dict) -> set[str]:
    return {j["job_id"] for j in page["jobs"]}


def test_job_lists_show_b_none_of_as_jobs_under_any_filter_or_cursor(world):
    w = world
    c = w.call
    a_jobs = {_queued_job(w), _succeeded_job(w)}
    arr = c("POST", "/v1/job-arrays", {"spec": {**VIDEO, "labels": {"exp": "isolation"}}, "count": 2},
            headers={"Idempotency-Key": w.key("arr")}, arn=A)
    assert arr.status == 202, arr.text
    a_jobs |= set(arr.json["job_ids"])
    b_job = _submit(w, {**VIDEO, "labels": {"exp": "isolation"}}, arn=B)
    queries = ["", "status=QUEUED", "status=SUCCEEDED&status=QUEUED", "label=exp=isolation",
               f"array_id={arr.json['array_id']}", "user=alice", "user=bob", "mine=true",
               "created_after=2000-01-01T00:00:00Z", "created_before=2100-01-01T00:00:00Z"]
    for q in queries:
        mine = c("GET", f"/v1/jobs?limit=100&{q}", arn=A)
        theirs = c("GET", f"/v1/jobs?limit=100&{q}", arn=B)
        assert theirs.status == 200, (q, theirs.text)
        assert not _ids(theirs.json) & a_jobs, q
        assert {j["tenant"] for j in theirs.json["jobs"]} <= {"t2"}, q
        assert mine.status == 200 and (_ids(mine.json) & a_jobs or q == "user=bob"), q  # the filter matches A's
    assert b_job in _ids(c("GET", "/v1/jobs?limit=100&label=exp=isolation", arn=B).json)
    # A's cursor is no key to A's pages for B: a 400 naming the cursor, no job of A's
    page = c("GET", "/v1/jobs?limit=1", arn=A).json
    assert page["next_cursor"]
    stolen = c("GET", f"/v1/jobs?limit=1&cursor={page['next_cursor']}", arn=B)
    assert stolen.status == 400 and stolen.headers["content-type"] == "application/problem+json", stolen.text
    assert stolen.json.get("param") == "cursor" and not any(j in stolen.text for j in a_jobs), stolen.text


def test_bulk_cancel_by_as_labels_or_array_cancels_nothing_of_as(world):
    w = world
    c = w.call
    arr = c("POST", "/v1/job-arrays", {"spec": {**VIDEO, "labels": {"exp": "bulk"}}, "count": 2},
            headers={"Idempotency-Key": w.key("arr")}, arn=A).json
    single = _submit(w, {**VIDEO, "labels": {"exp": "bulk"}})
    a_jobs = [*arr["job_ids"], single]
    before = {j: c("GET", f"/v1/jobs/{j}", arn=A).json for j in a_jobs}
    for body in ({"labels": {"exp": "bulk"}}, {"array_id": arr["array_id"]},
                 {"array_id": arr["array_id"], "labels": {"exp": "bulk"}}):
        r = c("POST", "/v1/jobs/cancel", body, arn=B)
        assert r.status == 200 and r.json == {"matched": 0, "cancelled": [], "skipped": []}, (body, r.text)
    assert {j: c("GET", f"/v1/jobs/{j}", arn=A).json for j in a_jobs} == before
    # the owner's own bulk cancel does match them
    mine = c("POST", "/v1/jobs/cancel", {"array_id": arr["array_id"]}, arn=A).json
    assert sorted(mine["cancelled"]) == sorted(arr["job_ids"])


def test_idempotency_keys_are_per_tenant(world):
    """B reusing A's Idempotency-Key (with A's payload or another) gets its own new job, never A's replay, nor a
    422 that would tell B the key is in use."""
    w = world
    c = w.call
    cases = (("/v1/jobs", VIDEO, {**VIDEO, "labels": {"other": "payload"}}),
             ("/v1/job-arrays", {"spec": VIDEO, "count": 2}, {"spec": VIDEO, "count": 1}))
    for path, body, other in cases:
        for payload in (body, other):
            key = w.key("shared")
            first = c("POST", path, body, headers={"Idempotency-Key": key}, arn=A)
            assert first.status == 202, first.text
            theirs = c("POST", path, payload, headers={"Idempotency-Key": key}, arn=B)
            assert theirs.status == 202 and "idempotent-replayed" not in theirs.headers, (path, theirs.text)
            mine, got = first.json, theirs.json
            assert not ({mine.get("job_id"), *mine.get("job_ids", [])} & {got.get("job_id"), *got.get("job_ids", [])}
                        - {None})
            assert got.get("array_id") is None or got["array_id"] != mine.get("array_id")
            for jid in filter(None, [got.get("job_id"), *got.get("job_ids", [])]):
                assert c("GET", f"/v1/jobs/{jid}", arn=B).json["tenant"] == "t2"
            again = c("POST", path, body, headers={"Idempotency-Key": key}, arn=A)  # A's key still replays A's
            assert again.headers.get("idempotent-replayed") == "true" and again.json == mine, again.text


def test_costs_show_b_none_of_as_ledger(world):
    from gpufleet.lifecycle.billing import Charge, Outcome
    from gpufleet.store.ledger import DynamoLedgerStore

    w = world
    c = w.call
    jid = _succeeded_job(w)
    ledger = DynamoLedgerStore(w.deps.ddb, w.deps.settings.tables)
    ledger.record({"job_id": jid, "tenant": "t1", "owner_path": "t1/vision/alice", "labels": {"exp": "isolation"}}, 1,
                  Charge(True, 100.0, Decimal("0.100001"), None, Outcome.SUCCEEDED), pool="cloud-spot", price=3.6,
                  at="2026-06-01T00:00:00.000Z")
    assert c("GET", "/v1/costs", arn=A).json["total"]["charged_attempts"] >= 1  # A's entry is there
    for q in ("", "?by=team", "?by=user", "?by=pool", "?by=label&label_key=exp", "?tenant=t2"):
        r = c("GET", f"/v1/costs{q}", arn=B)
        assert r.status == 200 and r.json["tenant"] == "t2", (q, r.text)
        assert r.json["total"]["charged_attempts"] == 0 and r.json["groups"] == [], (q, r.text)
    from gpufleet.devstack.gateway import build_event

    csv = c.api.handle(build_event("GET", "/v1/costs?by=user&format=csv", {}, b"", user_arn=B), None)
    assert csv["statusCode"] == 200 and "t1/" not in csv["body"]
    _assert_problem(c("GET", "/v1/costs?tenant=t1", arn=B), 403, "forbidden")
    _assert_problem(c("GET", "/v1/costs?tenant=nosuchtenant", arn=B), 403, "forbidden")  # the same: no leak


def test_webhook_endpoint_lists_and_cursors_are_per_tenant(world):
    w = world
    c = w.call
    a_eps = {_endpoint(w), _endpoint(w)}
    listed = c("GET", "/v1/webhooks/endpoints?limit=100", arn=B).json
    assert not {e["id"] for e in listed["endpoints"]} & a_eps
    page = c("GET", "/v1/webhooks/endpoints?limit=1", arn=A).json
    assert page["next_cursor"]
    stolen = c("GET", f"/v1/webhooks/endpoints?limit=1&cursor={page['next_cursor']}", arn=B)
    assert stolen.status == 400 and not any(e in stolen.text for e in a_eps), stolen.text
    # B's own endpoint is B's: A's list does not show it
    b_ep = c("POST", "/v1/webhooks/endpoints", {"url": URL}, arn=B).json["id"]
    assert b_ep not in {e["id"] for e in c("GET", "/v1/webhooks/endpoints?limit=100", arn=A).json["endpoints"]}


def test_webhook_signing_secrets_are_per_tenant(world):
    c = world.call
    a = c("GET", "/v1/webhooks/secrets", arn=A).json
    b = c("GET", "/v1/webhooks/secrets", arn=B).json
    assert a["tenant"] == "t1" and b["tenant"] == "t2"
    assert not {s["secret"] for s in a["secrets"]} & {s["secret"] for s in b["secrets"]}
    rotated = c("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": 0}, arn=B)
    assert rotated.status == 200 and rotated.json["tenant"] == "t2", rotated.text
    assert c("GET", "/v1/webhooks/secrets", arn=A).json == a  # B's rotation left A's secrets alone
    assert c("GET", "/v1/webhooks/secrets", arn=BOB).json == a  # A's tenant-mate sees A's tenant's


def test_quota_and_pools_show_no_other_tenant(world):
    w = world
    c = w.call
    before = c("GET", "/v1/quota", arn=B).json
    _queued_job(w)
    q = c("GET", "/v1/quota", arn=B).json
    assert q == before, "A's submission moved B's quota view"
    assert q["tenant"] == "t2" and all(lv["path"].startswith("t2") for lv in q["levels"]), q
    pools = c("GET", "/v1/pools", arn=B)
    assert pools.status == 200
    for leak in ("t1", "alice", "vision"):
        assert f'"{leak}' not in pools.text, leak
    assert pools.json == c("GET", "/v1/pools", arn=A).json  # the fleet view is the same for every tenant
    models = c("GET", "/v1/models", arn=B)  # the model catalog is the deployment's: the same for every tenant
    assert models.status == 200 and models.json == c("GET", "/v1/models", arn=A).json


def test_provenance_lookup_gives_b_the_manifest_only(world):
    """By design (docs/api.md): whoever holds a marked video learns the manifest it carried; the signed original
    (``video_url``) and ``own`` only to its tenant."""
    from gpufleet.provenance import robustness, watermark
    from gpufleet.provenance.watermark import WatermarkKey
    from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceEntry

    w = world
    c = w.call
    key = WatermarkKey(bytes.fromhex("42" * 32))
    jid = _succeeded_job(w)
    DynamoProvenanceIndex(w.deps.ddb, w.deps.settings.jobs_table).record(ProvenanceEntry(
        payload=watermark.payload_hex(jid), job_id=jid, key_id=key.key_id, video_key=f"jobs/{jid}/video.mp4",
        manifest_key=f"jobs/{jid}/video.c2pa", video_sha256="ab" * 32, published_at="2026-12-02T00:00:00Z"))
    luma = watermark.mean_luma(watermark.embed(robustness.generated_clip(4, 256), watermark.payload_for_job(jid), key))
    body = {"width": luma.shape[1], "height": luma.shape[0], "luma_b64": base64.b64encode(luma.tobytes()).decode()}
    theirs = c("POST", "/v1/provenance/lookup", body, arn=B)
    assert theirs.status == 200, theirs.text
    [m] = theirs.json["matches"]
    assert m["job_id"] == jid and m["own"] is False and m["video_url"] is None and "video.c2pa" in m["manifest_url"]
    assert "video.mp4" not in theirs.text
    [own] = c("POST", "/v1/provenance/lookup", body, arn=A).json["matches"]
    assert own["own"] is True and "video.mp4" in own["video_url"]


def test_operator_collections_refuse_a_tenant(world):
    c = world.call
    for path in ("/v1/admin/quarantine", "/v1/admin/quarantine?tenant=t1", "/v1/admin/quarantine?tenant=nosuch",
                 "/v1/admin/diagnose", "/v1/admin/diagnose?fleet=true&lanes=true"):
        _assert_problem(c("GET", path, arn=B), 403, "forbidden")
    assert c("GET", "/v1/admin/quarantine?tenant=t1", arn=OPERATOR).status == 200  # the route works for operators


# ----------------------------------------------------------------------------- the administration API

ADMIN_DOC = json.loads((Path(__file__).resolve().parents[3] / "docs" / "openapi-admin.json").read_text())
GHOST = f"arn:aws:iam::{ACCOUNT}:user/ghost"  # never registered
#: a body each write accepts (so that a tenant's refusal is the operator gate, not validation), and the query a
#: route needs; names are throwaway ones, so the operator's own call (the control) harms nothing of the module
ADMIN_REQUESTS: dict[tuple[str, str], tuple[str, Any]] = {
    ("PUT", "/v1/admin/nodes/{node_id}/pool"): ("", {"pool": "onprem-a"}),
    ("PUT", "/v1/admin/pools/{name}"): ("", {"region": "site-x", "gpu_type": "L4", "max_gpus": 1}),
    ("PUT", "/v1/admin/models/{name}"): ("", {"content_hash": "ab" * 32}),
    ("PUT", "/v1/admin/quota"): ("?path=ghost-tenant", {"guarantee": {"*": 1}}),
    ("GET", "/v1/admin/quota"): ("?path=t1", None),
    ("PUT", "/v1/admin/safety-reports/{job_id}"): ("", {"label": "safe", "prompt": "a fox"}),
    ("POST", "/v1/admin/tenants"): ("", {"tenant": "ghost-tenant"}),
    ("PATCH", "/v1/admin/tenants/{tenant}"): ("", {"display_name": "x"}),
    ("PUT", "/v1/admin/tenants/{tenant}/safety-profile"): ("", {"frame_thresholds": {}}),
    ("POST", "/v1/admin/tenants/{tenant}/teams"): ("", {"team": "ghost-team"}),
    ("POST", "/v1/admin/tenants/{tenant}/users"): ("", {"arn": GHOST, "team": "ghost-team", "user": "ghost"}),
    ("DELETE", "/v1/admin/tenants/{tenant}/users"): (f"?arn={GHOST}", None),
}
ADMIN_PARAMS = {"{tenant}": "t1", "{node_id}": "ghost-node", "{name}": "ghost-pool"}


def _control_items(w: World) -> list[dict]:
    got = w.deps.ddb.scan(TableName=w.deps.settings.control_table)["Items"]
    return sorted(got, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))


@pytest.mark.parametrize("op", _operations(ADMIN_DOC), ids=lambda op: f"{op[0]} {op[1]}")
def test_a_tenant_gets_no_operator_route_of_the_administration_api(world, op):
    """Every operation of ``docs/openapi-admin.json``, called by tenant principals (B, and A about its own tenant),
    is a 403 ``not-allowed`` that reads and writes nothing (the control table is unchanged); an operator's same
    call is not refused, so the 403 is the operator gate."""
    w = world
    method, template = op
    query, body = ADMIN_REQUESTS.get(op, ("", None))
    path = template.replace("{job_id}", _queued_job(w)) if "{job_id}" in template else template
    for name, value in ADMIN_PARAMS.items():
        path = path.replace(name, value)
    assert "{" not in path, f"{method} {template}: a new path parameter; add it to ADMIN_PARAMS"
    before = _control_items(w)
    for arn in (B, A):
        _assert_problem(w.admin(method, path + query, body, arn=arn), 403, "not-allowed")
    assert _control_items(w) == before, f"a tenant's {method} {template} changed the control table"
    control = w.admin(method, path + query, body, arn=OPERATOR)
    assert control.status != 403 and control.status < 500, control.text


# ----------------------------------------------------------------------------- completeness


def test_every_documented_operation_is_covered_or_listed(world):
    """The document the API serves is the committed one, and every operation in it is in exactly one table: a new
    route fails here until someone decides how another tenant is kept out of it."""
    served = world.call("GET", "/v1/openapi.json", arn=B)
    assert served.status == 200
    assert served.json == world.call("GET", "/v1/openapi.json", arn=A).json  # no per-tenant content
    ops = set(_operations(served.json))
    assert ops == set(_operations(DOC)), "docs/openapi.json is stale (python -m gpufleet.api.openapi --write)"
    tables = {"ID_ROUTES": set(ID_ROUTES), "COLLECTION_ROUTES": set(COLLECTION_ROUTES), "LISTED": set(LISTED)}
    uncovered = ops - set().union(*tables.values())
    assert not uncovered, f"operations no table tries as another tenant: {sorted(uncovered)}"
    for name, entries in tables.items():
        assert entries <= ops, f"{name} names operations the document no longer has: {sorted(entries - ops)}"
    for a, b in (("ID_ROUTES", "COLLECTION_ROUTES"), ("ID_ROUTES", "LISTED"), ("COLLECTION_ROUTES", "LISTED")):
        assert not tables[a] & tables[b], (a, b, tables[a] & tables[b])
    assert all("{" not in p for _m, p in COLLECTION_ROUTES), "an id route belongs in ID_ROUTES"
    stale = set(ADMIN_REQUESTS) - set(_operations(ADMIN_DOC))
    assert not stale, f"ADMIN_REQUESTS names operations docs/openapi-admin.json no longer has: {sorted(stale)}"
    missing = {t for t in COLLECTION_ROUTES.values() if not callable(globals().get(t))}
    assert not missing, f"COLLECTION_ROUTES names tests this module does not have: {missing}"
