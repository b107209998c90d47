"""The administration service on the in-memory store: conditional writes, parents, audit records, refusals."""

from __future__ import annotations

import pytest

from gpufleet.adminapi.models import NodeBindIn, PoolIn, QuotaIn, SafetyIn, TeamIn, TenantIn, TenantPatch, UserIn
from gpufleet.adminapi.service import AdminDeps, AdminService
from gpufleet.clock import FakeClock
from gpufleet.errors import Conflict, NotFound, ValidationFailed
from gpufleet.pools import merge_pools
from gpufleet.settings import PoolSettings
from gpufleet.store.admin import Ref
from gpufleet.store.fakes.admin import MemoryAdminStore
from gpufleet.store.principals import Principal

OPS = Principal(arn="arn:aws:iam::123456789012:role/ops", tenant="ops", team="platform", user="op", admin=True)
BOB = "arn:aws:iam::123456789012:user/bob"


@pytest.fixture
def svc():
    ids = iter(f"id{i:04d}" for i in range(1000))
    store = MemoryAdminStore()
    return AdminService(AdminDeps(store=store, clock=FakeClock(1_780_000_000.0), pools=PoolSettings().pools,
                                  new_id=lambda: next(ids)))


def onboard(svc: AdminService) -> None:
    svc.create_tenant(OPS, TenantIn(tenant="acme"))
    svc.create_team(OPS, "acme", TeamIn(team="vision"))
    svc.add_user(OPS, "acme", UserIn(arn=BOB, team="vision", user="bob"))


def test_onboarding_writes_each_document_once_with_its_audit_record(svc):
    onboard(svc)
    assert [u["user"] for u in svc.users("acme")] == ["bob"]
    assert [t["team"] for t in svc.teams("acme")] == ["vision"]
    with pytest.raises(Conflict):
        svc.create_tenant(OPS, TenantIn(tenant="acme"))
    with pytest.raises(Conflict):
        svc.add_user(OPS, "acme", UserIn(arn=BOB, team="vision", user="bob2"))
    log = svc.audit(None, 100)
    assert [r["action"] for r in log] == ["user.add", "team.create", "tenant.create"]
    assert all(r["actor"] == OPS.arn for r in log)


def test_parents_must_exist(svc):
    with pytest.raises(NotFound):
        svc.create_team(OPS, "nope", TeamIn(team="t"))
    svc.create_tenant(OPS, TenantIn(tenant="acme"))
    with pytest.raises(NotFound):
        svc.add_user(OPS, "acme", UserIn(arn=BOB, team="ghost", user="bob"))
    with pytest.raises(NotFound):
        svc.set_quota(OPS, "acme/ghost", QuotaIn(guarantee={"*": 1000}))
    assert svc.audit(None, 10)[0]["action"] == "tenant.create"  # refused changes leave no record


def test_quota_versions_are_conditional(svc):
    onboard(svc)
    q = svc.set_quota(OPS, "acme/vision", QuotaIn(guarantee={"*": 2000}, borrow_limit={"*": 1000}))
    assert q["version"] == 1 and q["limits"] == {"*": 3000}
    q = svc.set_quota(OPS, "acme/vision", QuotaIn(guarantee={"*": 1000}))
    assert q["version"] == 2
    with pytest.raises(Conflict) as err:
        svc.set_quota(OPS, "acme/vision", QuotaIn(guarantee={"*": 500}, expected_version=1))
    assert err.value.extra["current_version"] == 2
    with pytest.raises(ValidationFailed):
        svc.set_quota(OPS, "acme/vision/x/y", QuotaIn())
    svc.set_quota(OPS, "acme", QuotaIn(guarantee={"*": 4000}))
    assert [(n["path"], n["version"]) for n in svc.quotas()] == [("acme", 1), ("acme/vision", 2)]


def test_bad_input_is_refused_before_anything_is_written(svc):
    with pytest.raises(ValueError):
        QuotaIn(guarantee={"Z80": 1})
    with pytest.raises(ValueError):
        UserIn(arn="not-an-arn", team="t", user="u")
    onboard(svc)
    with pytest.raises(ValidationFailed):
        svc.set_safety(OPS, "acme", SafetyIn(frame_thresholds={"exposed_skin": 7.0}))
    with pytest.raises(NotFound):
        svc.update_tenant(OPS, "ghost", TenantPatch(display_name="x"))


def test_safety_profile_versions(svc):
    onboard(svc)
    p = svc.set_safety(OPS, "acme", SafetyIn(frame_thresholds={"exposed_skin": 0.5}))
    assert p["version"] == 1 and p["frame_thresholds"] == {"exposed_skin": 0.5}
    assert svc.set_safety(OPS, "acme", SafetyIn())["version"] == 2


def test_pools_overlay_and_node_binding(svc):
    svc.put_pool(OPS, "lab-b", PoolIn(region="site-b", gpu_type="L4", max_gpus=8))
    assert {"lab-b", "onprem-a"} <= {p["name"] for p in svc.pools()}
    with pytest.raises(ValidationFailed):
        svc.put_pool(OPS, "new-cloud", PoolIn(kind="spot", region="r", gpu_type="L4", max_gpus=1))
    store = svc.d.store
    store.db.put("control", {"pk": "NODE#n1", "sk": "REGISTRATION", "node_id": "n1", "pool": "onprem-a"})
    store.db.put("control", {"pk": "NODE#n1", "sk": "NODE", "node_id": "n1", "draining": False})
    assert svc.bind_node(OPS, "n1", NodeBindIn(pool="lab-b"))["pool"] == "lab-b"
    with pytest.raises(ValidationFailed):
        svc.bind_node(OPS, "n1", NodeBindIn(pool="nowhere"))
    assert svc.drain(OPS, "n1", True)["drained"] is True
    assert store.db.get("control", ("NODE#n1", "NODE"))["draining"] is True
    assert svc.drain(OPS, "n1", False)["drained"] is False
    with pytest.raises(NotFound):
        svc.drain(OPS, "ghost", True)


def test_deregistration_refuses_a_node_with_attempts_unless_forced_and_is_audited(svc):
    store = svc.d.store
    store.db.put("control", {"pk": "NODE#n1", "sk": "REGISTRATION", "node_id": "n1", "pool": "onprem-a",
                             "version": 3})
    store.db.put("control", {"pk": "NODE#n1", "sk": "NODE", "node_id": "n1", "draining": False,
                             "gsi2pk": "DIR#NODES"})
    store.db.put("control", {"pk": "ALLOC#n1", "sk": "BOOK", "g0": 1000})
    store.db.put("control", {"pk": "ALLOC#n1", "sk": "job-a#2", "node": "n1"})
    with pytest.raises(Conflict, match="holds 1 attempt.*job-a#2.*force") as refused:
        svc.deregister(OPS, "n1")
    assert refused.value.problem("/x")["current_version"] == 3
    assert svc.node("n1")["version"] == 3 and svc.audit(None, 10) == []  # refused: nothing changed, no record
    with pytest.raises(Conflict):  # a stale version is refused too
        svc.deregister(OPS, "n1", force=True, expected_version=2)
    out = svc.deregister(OPS, "n1", force=True)
    assert out == {"node_id": "n1", "deregistered_at": "2026-05-28T20:26:40.000Z", "pool": "onprem-a",
                   "attempts": ["job-a#2"], "forced": True}
    with pytest.raises(NotFound):
        svc.node("n1")
    stone = store.db.get("control", ("NODE#n1", "NODE"))
    assert stone["deregistered_at"] == out["deregistered_at"] and stone["draining"] is True
    assert "gsi2pk" not in stone and stone["expires_at"] == 1_780_000_000 + 86_400
    (record,) = svc.audit(None, 10)
    assert (record["action"], record["actor"], record["detail"]["force"]) == ("node.deregister", OPS.arn, True)
    with pytest.raises(NotFound):
        svc.deregister(OPS, "n1", force=True)
    store.db.put("control", {"pk": "NODE#n2", "sk": "REGISTRATION", "node_id": "n2", "pool": "onprem-a"})
    assert svc.deregister(OPS, "n2")["forced"] is False  # no attempts: no force needed


def test_merge_pools_overrides_a_deployed_pool_and_skips_bad_documents():
    deployed = PoolSettings().pools
    merged = {p.name: p for p in merge_pools(deployed, [{"name": "onprem-a", "max_gpus": 3},
                                                        {"name": "bad", "gpu_type": "Z80"}], skip_invalid=True)}
    assert merged["onprem-a"].max_gpus == 3 and "bad" not in merged
    with pytest.raises(ValueError):
        merge_pools(deployed, [{"name": "cloud-spot", "kind": "onprem"}])


def test_remove_user(svc):
    onboard(svc)
    with pytest.raises(NotFound):
        svc.remove_user(OPS, "other", BOB)
    svc.remove_user(OPS, "acme", BOB)
    assert svc.d.store.get(Ref("principal", BOB)) is None


def test_the_committed_admin_openapi_document_is_current():
    from gpufleet.adminapi import openapi

    assert openapi.main(["--check"]) == 0, "run `python -m gpufleet.adminapi.openapi --write`"
    paths = openapi.document()["paths"]
    assert {"/v1/admin/tenants", "/v1/admin/quota", "/v1/admin/nodes/{node_id}/drain"} <= set(paths)


JOB = "job_01m8nmrydh0vmje86g7ncnjh9j"


def test_safety_reports_are_conditional_audited_and_classified_against_the_recorded_decision(svc):
    from gpufleet.adminapi.models import SafetyReportIn

    missed = SafetyReportIn(label="unsafe", category="hate", prompt="p", decision={
        "allowed": True, "nearest_category": "hate", "nearest_score": 0.1, "policy_version": "v1", "reason": None,
        "extra": 1})
    doc = svc.report_safety(OPS, JOB, missed)
    assert doc["kind"] == "false_negative" and doc["version"] == 1 and doc["reported_by"] == OPS.arn
    assert doc["decision"] == {"allowed": True, "nearest_category": "hate", "nearest_score": 0.1, "policy_version": "v1"}
    with pytest.raises(Conflict):  # relabelling names the version it replaces
        svc.report_safety(OPS, JOB, SafetyReportIn(label="safe", prompt="p", expected_version=7))
    relabelled = svc.report_safety(OPS, JOB, SafetyReportIn(label="safe", prompt="p", decision={"allowed": False},
                                                             expected_version=1))
    assert (relabelled["kind"], relabelled["version"], relabelled["label"]) == ("false_positive", 2, "safe")
    other = "job_01m8nmrydh0vmje86g7ncnjh9k"
    svc.report_safety(OPS, other, SafetyReportIn(label="unsafe", category="drugs", prompt="q"))
    assert [r["job_id"] for r in svc.safety_reports()] == [JOB, other] and svc.safety_report(other)["label"] == "unsafe"
    log = svc.audit(None, 10)
    assert [r["action"] for r in log][:3] == ["safety.report"] * 3 and "prompt" not in log[0]["detail"]
    with pytest.raises(ValidationFailed):  # an unsafe report names its category
        svc.report_safety(OPS, other, SafetyReportIn(label="unsafe", prompt="q"))
    with pytest.raises(ValidationFailed):
        svc.report_safety(OPS, "not-a-job", SafetyReportIn(label="safe", prompt="q"))
    with pytest.raises(NotFound):
        svc.safety_report("job_01m8nmrydh0vmje86g7ncnjh9z")
