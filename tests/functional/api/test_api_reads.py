"""Issue 3 read endpoints on moto: logs (follow with `after`), output links, webhook log, quota, pools."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from api_helpers import ALICE, CAROL, VIDEO

from gpufleet.scheduler.model import QuotaNode
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs as job_store
from gpufleet.store.nodes import put_node
from gpufleet.store.objects import chunk_key
from gpufleet.store.quotas import put_quota
from gpufleet.tables import job_pk


def _job(call):
    return call("POST", "/v1/jobs", VIDEO, headers={"Idempotency-Key": "r1"}).json["job_id"]


def _chunk(s3, job_id, epoch, seq, msgs):
    body = "\n".join(json.dumps({"ts": "t", "level": "INFO", "msg": m, "job_id": job_id, "epoch": epoch}) for m in msgs)
    s3.put_object(Bucket="gpufleet-logs", Key=chunk_key(job_id, epoch, seq), Body=body.encode())


def test_logs_follow_across_chunks_and_attempts(call, s3):
    jid = _job(call)
    empty = call("GET", f"/v1/jobs/{jid}/logs")
    assert empty.status == 200 and empty.json["lines"] == [] and empty.json["next"] is None
    _chunk(s3, jid, 1, 1, ["a", "b"])
    _chunk(s3, jid, 1, 2, ["c"])
    first = call("GET", f"/v1/jobs/{jid}/logs").json
    assert [x["msg"] for x in first["lines"]] == ["a", "b", "c"] and first["next"] == "0001/00000002"
    again = call("GET", f"/v1/jobs/{jid}/logs?after={first['next']}").json
    assert again["lines"] == [] and again["next"] == first["next"]
    _chunk(s3, jid, 2, 1, ["d"])  # a retry writes under a new attempt
    s3.put_object(Bucket="gpufleet-logs", Key=chunk_key(jid, 2, 2), Body=b"not json\n")
    more = call("GET", f"/v1/jobs/{jid}/logs?after={first['next']}").json
    assert [x["msg"] for x in more["lines"]] == ["d", "not json"] and more["next"] == "0002/00000002"
    assert call("GET", f"/v1/jobs/{jid}/logs?after=../../x").status == 400
    assert call("GET", f"/v1/jobs/{jid}/logs", arn=CAROL).status == 404


def test_output_only_for_succeeded_with_short_lived_links(call, deps):
    jid = _job(call)
    r = call("GET", f"/v1/jobs/{jid}/output")
    assert r.status == 409 and r.json["current_status"] == "QUEUED"
    t = deps.settings.jobs_table
    for a, b in ((S.QUEUED, S.PENDING), (S.PENDING, S.SCHEDULED), (S.SCHEDULED, S.RUNNING), (S.RUNNING, S.FINALIZING)):
        job_store.transition(deps.ddb, t, jid, [a], b, clock=deps.clock)
    out = {"video_key": f"jobs/{jid}/video.mp4", "manifest_key": f"jobs/{jid}/video.c2pa", "watermark_payload": "abc"}
    job_store.transition(deps.ddb, t, jid, [S.FINALIZING], S.SUCCEEDED, {"output": out}, clock=deps.clock)
    ok = call("GET", f"/v1/jobs/{jid}/output")
    assert ok.status == 200 and ok.json["watermark_payload"] == "abc"
    for name in ("video_url", "manifest_url"):
        q = parse_qs(urlsplit(ok.json[name]).query)
        assert int(q["X-Amz-Expires"][0]) <= 900
    assert urlsplit(ok.json["video_url"]).path.endswith("video.mp4")
    assert call("GET", f"/v1/jobs/{jid}/output", arn=CAROL).status == 404


def test_output_of_a_container_job_lists_its_files_with_short_lived_links(call, deps, s3):
    body = {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1", "command": ["true"]}}
    jid = call("POST", "/v1/jobs", body, headers={"Idempotency-Key": "c1"}).json["job_id"]
    t = deps.settings.jobs_table
    for a, b in ((S.QUEUED, S.PENDING), (S.PENDING, S.SCHEDULED), (S.SCHEDULED, S.RUNNING), (S.RUNNING, S.FINALIZING)):
        job_store.transition(deps.ddb, t, jid, [a], b, clock=deps.clock)
    prefix = f"jobs/{jid}/output/e0001/"
    for name, data in (("metrics.json", b"{}"), ("model/weights.bin", b"w" * 40)):
        s3.put_object(Bucket="gpufleet-outputs", Key=prefix + name, Body=data)
    s3.put_object(Bucket="gpufleet-outputs", Key=f"jobs/{jid}/output/e0002/late.bin", Body=b"x")  # a fenced worker
    out = {"kind": "files", "prefix": prefix, "files": 2, "bytes": 42}
    job_store.transition(deps.ddb, t, jid, [S.FINALIZING], S.SUCCEEDED, {"output": out}, clock=deps.clock)
    ok = call("GET", f"/v1/jobs/{jid}/output")
    assert ok.status == 200 and ok.json["kind"] == "files" and ok.json["video_url"] is None
    assert [(f["path"], f["bytes"]) for f in ok.json["files"]] == [("metrics.json", 2), ("model/weights.bin", 40)]
    assert ok.json["total_bytes"] == 42
    for f in ok.json["files"]:
        q = parse_qs(urlsplit(f["url"]).query)
        assert int(q["X-Amz-Expires"][0]) <= 900 and urlsplit(f["url"]).path.endswith(f["path"])
    assert call("GET", f"/v1/jobs/{jid}/output", arn=CAROL).status == 404


def test_webhook_delivery_log(call, deps):
    jid = _job(call)
    assert call("GET", f"/v1/jobs/{jid}/webhooks").json == {"job_id": jid, "deliveries": []}
    deps.ddb.put_item(
        TableName=deps.settings.jobs_table,
        Item={
            "pk": {"S": job_pk(jid)},
            "sk": {"S": "DELIVERY#2026-01-01T00:00:00.000Z#d1"},
            "delivery_id": {"S": "d1"},
            "event": {"S": "completed"},
            "attempt": {"N": "2"},
            "status_code": {"N": "200"},
            "ok": {"BOOL": True},
        },
    )
    got = call("GET", f"/v1/jobs/{jid}/webhooks").json["deliveries"]
    assert len(got) == 1
    assert {k: got[0][k] for k in ("delivery_id", "event", "attempt", "status_code", "ok")} == {
        "delivery_id": "d1",
        "event": "completed",
        "attempt": 2,
        "status_code": 200,
        "ok": True,
    }
    assert call("GET", f"/v1/jobs/{jid}/webhooks", arn=CAROL).status == 404


def test_quota_shows_tree_and_queued_counts(call, deps):
    put_quota(deps.ddb, deps.settings.control_table, QuotaNode("t1", {"*": 8000}, {"*": 4000}, {"*": 2.0}))
    put_quota(deps.ddb, deps.settings.control_table, QuotaNode("t1/vision", {"A100": 2000}, {}, {}))
    deps.ddb.update_item(
        TableName=deps.settings.control_table,
        Key={"pk": {"S": "QUOTA#t1"}, "sk": {"S": "QUOTA"}},
        UpdateExpression="SET used_all = :u",
        ExpressionAttributeValues={":u": {"N": "1500"}},
    )
    _job(call)
    q = call("GET", "/v1/quota", arn=ALICE).json
    assert [lv["path"] for lv in q["levels"]] == ["t1", "t1/vision", "t1/vision/alice"]
    tenant, team, user = q["levels"]
    assert tenant["limits"] == {"*": 12000.0} and tenant["usage"] == {"all": 1500.0} and tenant["weight"] == {"*": 2.0}
    assert team["limits"] == {"A100": 2000.0} and user["configured"] is False
    assert q["queued"] == {"user": 1, "team": 1, "user_limit": 100, "team_limit": 1000}


def test_pools_with_capacity(call, deps, clock):
    put_node(
        deps.ddb,
        deps.settings.control_table,
        {
            "node_id": "n1",
            "pool": "onprem-a",
            "queue_url": "q",
            "gpu_type": "A100",
            "gpus": [
                {"index": 0, "memory_gb": 80, "milli_free": 1000},
                {"index": 1, "memory_gb": 80, "milli_free": 500},
            ],
            "cpu_milli_free": 8000,
            "memory_mib_free": 64000,
            "heartbeat_at": "x",
            "expires_at": int(clock.now()) + 60,
            "draining": False,
        },
    )
    r = call("GET", "/v1/pools")
    assert r.status == 200
    pools = {p["name"]: p for p in r.json["pools"]}
    assert pools["onprem-a"]["capacity"] == {"gpus_total": 2.0, "gpus_free": 1.5, "nodes": 1, "gpus_in_use": None}
    assert pools["cloud-spot"]["capacity"]["gpus_total"] == pools["cloud-spot"]["max_gpus"]
