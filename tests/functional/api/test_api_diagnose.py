"""``GET /v1/admin/diagnose`` through the API handler on moto: operators only, the window checked, the attribution
of the nodes' GPU time (the store reader is tested on its own in tests/functional/store)."""

from __future__ import annotations

from api_helpers import ACCOUNT, ALICE

from gpufleet.store.nodes import put_node
from gpufleet.store.principals import put_principal

OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/operator"


def test_operators_get_the_attribution_and_tenants_are_refused(deps, call, ddb, tables, clock):
    put_principal(ddb, tables.control, OPERATOR, "ops", "platform", "oncall", admin=True)
    put_node(ddb, tables.control, {"node_id": "n1", "pool": "onprem-a", "gpu_type": "L4",
                                   "gpus": [{"index": 0}, {"index": 1}], "expires_at": int(clock.now() + 60)})
    r = call("GET", "/v1/admin/diagnose", arn=ALICE)
    assert r.status == 403 and "operator" in r.json["detail"], r.text
    r = call("GET", "/v1/admin/diagnose?lanes=true", arn=OPERATOR)
    assert r.status == 200, r.text
    body = r.json
    assert body["end"] - body["start"] == 3600 and body["gpus"] == 2
    assert body["causes"] == [{"cause": "free_no_work", "gpu_seconds": 7200.0, "share": 1.0, "lost": False,
                               "meaning": "free with nothing runnable in the queue",
                               "fix": "none needed: right-size the pool"}]
    assert [(ln["node"], ln["gpu"]) for ln in body["lanes"]] == [("n1", 0), ("n1", 1)]
    assert "fleet" not in body or body["fleet"] is None
    put_node(ddb, tables.control, {"node_id": "n0", "pool": "onprem-a", "gpu_type": "L4", "gpus": [{"index": 0}],
                                   "resident_models": ["wan"], "expires_at": int(clock.now() - 1)})
    fleet = call("GET", "/v1/admin/diagnose?fleet=true", arn=OPERATOR).json["fleet"]
    assert [(n["node_id"], n["state"], n["resident_models"]) for n in fleet] == [("n0", "lost", ["wan"]),
                                                                                ("n1", "ready", [])]
    assert call("GET", "/v1/admin/diagnose?pool=elsewhere", arn=OPERATOR).json["gpus"] == 0
    for bad in ("since=2026-01-01T00:00:00", "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
                "since=2026-01-01T00:00:00Z&until=2026-03-01T00:00:00Z"):
        r = call("GET", f"/v1/admin/diagnose?{bad}", arn=OPERATOR)
        assert r.status == 400 and r.headers["content-type"].startswith("application/problem+json"), (bad, r.text)
