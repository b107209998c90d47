"""The fleet view (pure): each node's state from its liveness item, its GPUs and models, ordered by node id."""

from __future__ import annotations

from gpufleet.diagnose.fleet import fleet_view, node_state

NOW = 1_780_000_000.0


def item(node_id: str, **kw):
    return {"node_id": node_id, "pool": "onprem-a", "gpu_type": "L4", "expires_at": int(NOW) + 30,
            "gpus": [{"index": 1, "memory_gb": 24, "milli_free": 0}, {"index": 0, "memory_gb": 24, "milli_free": 1000}],
            "queue_url": "https://sqs/secret-ish", **kw}


def test_state_is_lost_when_the_heartbeat_expired_else_draining_else_ready():
    assert node_state(item("a"), NOW) == "ready"
    assert node_state(item("a", draining=True), NOW) == "draining"
    assert node_state(item("a", expires_at=int(NOW)), NOW) == "lost"  # expiry is exclusive
    assert node_state(item("a", expires_at=int(NOW) - 5, draining=True), NOW) == "lost"
    assert node_state({"node_id": "a"}, NOW) == "lost"  # no heartbeat recorded
    assert node_state(item("a", expires_at="garbage"), NOW) == "lost"


def test_rows_carry_gpus_in_order_and_models_and_never_the_queue():
    rows = fleet_view([item("b", resident_models=["wan-1.3b"], cached_models=["wan-1.3b", "ltx"], running_jobs=1,
                            labels={"site": "lab"}),
                       item("a", expires_at=int(NOW) - 1), {"pool": "no-id"}], NOW)
    assert [(r["node_id"], r["state"]) for r in rows] == [("a", "lost"), ("b", "ready")]
    b = rows[1]
    assert [g["index"] for g in b["gpus"]] == [0, 1] and b["gpus"][0]["milli_free"] == 1000
    assert b["resident_models"] == ["wan-1.3b"] and b["cached_models"] == ["ltx", "wan-1.3b"]
    assert b["running_jobs"] == 1 and b["labels"] == {"site": "lab"}
    assert all("queue_url" not in r for r in rows)
    assert rows[0]["resident_models"] == [] and rows[0]["heartbeat_at"] is None
