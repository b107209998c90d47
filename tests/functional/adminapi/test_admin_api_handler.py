"""The administration API handler on moto: operators only, conditional writes with audit records, problems."""

from __future__ import annotations

import json

import pytest
from adminapi_helpers import ALICE, OPERATOR

from gpufleet.devstack.gateway import build_event
from gpufleet.errors import NotAllowed
from gpufleet.nodeapi.liveness import LivenessReport, Registration, node_item
from gpufleet.settings import PoolSettings
from gpufleet.store.nodes import DynamoNodeStore
from gpufleet.store.principals import resolve
from gpufleet.store.snapshot import load_snapshot, tenant_policies

BOB = "arn:aws:iam::123456789012:user/bob"


def call(world, method, path, body=None, *, who=OPERATOR):
    raw = b"" if body is None else json.dumps(body).encode()
    resp = world["api"].handle(build_event(method, path, {"Content-Type": "application/json"}, raw, user_arn=who))
    return resp["statusCode"], json.loads(resp["body"] or "null")


def test_only_admin_principals_get_in_and_nothing_changes_otherwise(world):
    assert call(world, "POST", "/v1/admin/tenants", {"tenant": "acme"}, who=ALICE)[0] == 403
    assert call(world, "GET", "/v1/admin/tenants", who="arn:aws:iam::123456789012:user/nobody")[0] == 403
    assert call(world, "GET", "/v1/admin/tenants")[1] == {"items": []}


def test_onboarding_then_the_user_resolves_and_every_change_is_audited(world):
    assert call(world, "POST", "/v1/admin/tenants", {"tenant": "acme", "placement_policy": "cost"})[0] == 201
    assert call(world, "POST", "/v1/admin/tenants/acme/teams", {"team": "vision"})[0] == 201
    status, user = call(world, "POST", "/v1/admin/tenants/acme/users", {"arn": BOB, "team": "vision", "user": "bob"})
    assert status == 201 and user["version"] == 1
    who = resolve(world["ddb"], world["tables"].control, BOB)
    assert (who.tenant, who.team, who.user, who.admin) == ("acme", "vision", "bob", False)
    status, q = call(world, "PUT", "/v1/admin/quota?path=acme/vision", {"guarantee": {"*": 2000}, "weight": {"*": 2}})
    assert status == 200 and q["limits"] == {"*": 2000}
    snap = load_snapshot(world["ddb"], world["tables"], PoolSettings().pools, 1_780_000_000.0)
    assert snap.quotas["acme/vision"].guarantee == {"*": 2000}
    assert [q["path"] for q in call(world, "GET", "/v1/admin/quota")[1]["items"]] == ["acme/vision"]
    assert tenant_policies(world["ddb"], world["tables"].control, {"acme"}) == {"acme": "cost"}
    actions = [r["action"] for r in call(world, "GET", "/v1/admin/audit?month=2026-05")[1]["items"]]
    assert actions == ["quota.set", "user.add", "team.create", "tenant.create"]


def test_refusals_are_problems(world):
    status, p = call(world, "POST", "/v1/admin/tenants/ghost/teams", {"team": "x"})
    assert status == 404 and p["type"].endswith("/not-found")
    call(world, "POST", "/v1/admin/tenants", {"tenant": "acme"})
    status, p = call(world, "POST", "/v1/admin/tenants", {"tenant": "acme"})
    assert status == 409 and p["current_version"] == 1
    status, p = call(world, "POST", "/v1/admin/tenants", {"tenant": "bad name!"})
    assert status == 400 and p["errors"][0]["field"] == "tenant"
    status, p = call(world, "POST", "/v1/admin/tenants", {"tenant": "x", "surprise": 1})
    assert status == 400
    call(world, "POST", "/v1/admin/tenants/acme/teams", {"team": "vision"})
    call(world, "PUT", "/v1/admin/quota?path=acme", {"guarantee": {"*": 1000}})
    status, p = call(world, "PUT", "/v1/admin/quota?path=acme", {"guarantee": {"*": 1}, "expected_version": 7})
    assert status == 409 and p["current_version"] == 1
    status, p = call(world, "PUT", "/v1/admin/quota?path=acme", {"guarantee": {"Z80": 1}})
    assert status == 400
    assert call(world, "GET", "/v1/admin/nope")[0] == 404
    assert len(call(world, "GET", "/v1/admin/audit?month=2026-05")[1]["items"]) == 3  # refusals leave no record


def test_drain_and_bind_reach_the_scheduler_and_the_heartbeat(world):
    ddb, table = world["ddb"], world["tables"].control
    nodes = DynamoNodeStore(ddb, table)
    nodes.register(Registration(node_id="n1", pool="onprem-a", gpus=2))
    reg = nodes.registration("n1")
    nodes.put(node_item(reg, LivenessReport(free_milli={0: 1000, 1: 1000}, ttl_s=60), now=1_780_000_000.0,
                        max_ttl_s=300))
    status, body = call(world, "PUT", "/v1/admin/pools/lab-b", {"region": "site-b", "gpu_type": "L4", "max_gpus": 4})
    assert status == 200 and body["kind"] == "onprem"
    assert call(world, "PUT", "/v1/admin/nodes/n1/pool", {"pool": "lab-b"})[1]["pool"] == "lab-b"
    assert call(world, "POST", "/v1/admin/nodes/n1/drain")[1]["drained"] is True
    snap = load_snapshot(ddb, world["tables"], PoolSettings().pools, 1_780_000_000.0)
    assert [n.draining for n in snap.nodes] == [True] and "lab-b" in {p.name for p in snap.pools}
    reg = nodes.registration("n1")  # bookkeeping attributes do not break the node API's read
    item = node_item(reg, LivenessReport(free_milli={0: 1000}, ttl_s=60), now=1_780_000_001.0, max_ttl_s=300)
    assert item["draining"] and item["pool"] == "lab-b" and item["gpus"][0]["milli_free"] == 0
    assert call(world, "POST", "/v1/admin/nodes/n1/undrain")[1]["drained"] is False
    assert call(world, "POST", "/v1/admin/nodes/ghost/drain")[0] == 404


def test_deregistration_through_the_handler_removes_the_node_from_the_scheduler_and_the_heartbeat(world):
    ddb, table = world["ddb"], world["tables"].control
    nodes = DynamoNodeStore(ddb, table)
    nodes.register(Registration(node_id="n2", pool="onprem-a", gpus=1, registered_at="2026-05-28T00:00:00.000Z"))
    reg = nodes.registration("n2")
    nodes.put(node_item(reg, LivenessReport(free_milli={0: 1000}, ttl_s=60), now=1_780_000_000.0, max_ttl_s=300))
    ddb.put_item(TableName=table, Item={"pk": {"S": "ALLOC#n2"}, "sk": {"S": "job-x#1"}, "node": {"S": "n2"}})
    status, p = call(world, "DELETE", "/v1/admin/nodes/n2")
    assert status == 409 and "job-x#1" in p["detail"] and "force" in p["detail"]
    assert call(world, "DELETE", "/v1/admin/nodes/n2?force=true", who=ALICE)[0] == 403
    assert call(world, "DELETE", "/v1/admin/nodes/n2?force=maybe")[0] == 400
    status, out = call(world, "DELETE", "/v1/admin/nodes/n2?force=true")
    assert status == 200 and out["attempts"] == ["job-x#1"] and out["forced"] is True
    assert call(world, "GET", "/v1/admin/nodes/n2")[0] == 404 and nodes.registration("n2") is None
    snap = load_snapshot(ddb, world["tables"], PoolSettings().pools, 1_780_000_000.0)
    assert "n2" not in {n.node_id for n in snap.nodes}
    with pytest.raises(NotAllowed):  # a heartbeat that read the registration before the delete lands nothing
        nodes.put(node_item(reg, LivenessReport(free_milli={0: 1000}, ttl_s=60), now=1_780_000_001.0, max_ttl_s=300),
                  registered_at=reg.registered_at)
    assert call(world, "DELETE", "/v1/admin/nodes/n2?force=true")[0] == 404
    audit = call(world, "GET", "/v1/admin/audit?month=" + out["deregistered_at"][:7])[1]["items"]
    assert audit[0]["action"] == "node.deregister" and audit[0]["detail"]["attempts"] == ["job-x#1"]


def test_safety_reports_through_the_handler_on_moto(world):
    job = "job_01m8nmrydh0vmje86g7ncnjh9j"
    body = {"label": "unsafe", "category": "hate", "prompt": "p", "decision": {"allowed": True}}
    assert call(world, "PUT", f"/v1/admin/safety-reports/{job}", body, who=ALICE)[0] == 403
    status, doc = call(world, "PUT", f"/v1/admin/safety-reports/{job}", body)
    assert status == 200 and doc["kind"] == "false_negative" and doc["version"] == 1
    status, p = call(world, "PUT", f"/v1/admin/safety-reports/{job}", {**body, "expected_version": 0})
    assert status == 409 and p["current_version"] == 1
    assert call(world, "PUT", f"/v1/admin/safety-reports/{job}", {**body, "label": "maybe"})[0] == 400
    assert call(world, "GET", f"/v1/admin/safety-reports/{job}")[1]["prompt"] == "p"
    assert [r["job_id"] for r in call(world, "GET", "/v1/admin/safety-reports")[1]["items"]] == [job]
    assert call(world, "GET", "/v1/admin/safety-reports/job_01m8nmrydh0vmje86g7ncnjh9z")[0] == 404
