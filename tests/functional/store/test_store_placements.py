"""The scheduler's placement writes on moto: the commit transaction, token completion, release,
quota conditions, preemption requests (gpufleet/store/placements.py, read back through gpufleet/store/snapshot.py)."""

from __future__ import annotations

import json

import boto3
from botocore.stub import Stubber
from sched_moto import NOW, add_node, add_pending, add_quota, control_items

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.store import placements as store
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.snapshot import load_snapshot
from gpufleet.tables import JOB_META, attempt_sk, job_pk

POOLS = load_pools({})


def _job(ddb, names, job_id):
    return unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}))["Item"])


def test_commit_moves_job_books_gpus_charges_quota_and_completes_token(ddb, tables):
    names = tables
    add_node(ddb, names, "node-1", gpus=2)
    add_quota(ddb, names, "acme/vision", {"A100": 4000})
    add_pending(ddb, names, "job_a", gpus=0.5, token="tok-a")
    snap = load_snapshot(ddb, names, POOLS, NOW)
    assert [j.job_id for j in snap.jobs] == ["job_a"]
    result = run_cycle(snap)
    (p,) = result.placements
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    stub = Stubber(sfn)
    expected_doc = p.to_json(1)
    stub.add_response("send_task_success", {}, {"taskToken": "tok-a", "output": json.dumps(expected_doc)})
    with stub:
        res = store.commit(ddb, names, p, snap.quotas, NOW, sfn=sfn)
    stub.assert_no_pending_responses()
    assert res.ok and res.epoch == 1
    job = _job(ddb, names, "job_a")
    assert job["status"] == "SCHEDULED" and job["current_epoch"] == 1 and "gsi3pk" not in job
    assert job["placement"]["node"] == "node-1" and job["placement"]["gpu_milli"] == 500
    att = unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk("job_a"), "sk": attempt_sk(1)}))["Item"])
    assert att["state"] == "PLACED" and att["charge"]["charge_milli"] == 500
    events = ddb.query(
        TableName=names.jobs,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :ev)",
        ExpressionAttributeValues={":pk": {"S": job_pk("job_a")}, ":ev": {"S": "EVENT#"}},
    )["Items"]
    (placed,) = [unmarshal(e) for e in events if unmarshal(e)["detail"].get("to") == "SCHEDULED"]
    assert placed["detail"]["epoch"] == 1 and placed["detail"]["nodes"] == ["node-1"]
    (book,) = [i for i in control_items(ddb, names, "ALLOC#node-1") if i["sk"] == "BOOK"]
    g = p.members[0].gpu_indices[0]
    assert book[f"g{g}"] == 500
    quota = {i["pk"]: i for i in control_items(ddb, names, "QUOTA#")}
    for path in ("acme", "acme/vision", "acme/vision/ann"):
        assert quota[f"QUOTA#{path}"]["used_A100"] == 500 and quota[f"QUOTA#{path}"]["used_all"] == 500
    # the next snapshot sees the booking and the usage
    again = load_snapshot(ddb, names, POOLS, NOW)
    assert sorted(again.nodes[0].gpu_free) == [500, 1000]
    assert again.usage["acme/vision"]["A100"] == 500 and len(again.running) == 1 and not again.jobs


def test_a_placement_whose_workflow_no_longer_waits_gives_its_capacity_back(ddb, tables):
    """The job was cancelled (or its wait timed out) between the snapshot and the token: the commit landed,
    the token is gone, so the booking, the allocation record and the quota usage are released at once (the
    workflow's ClassifyFailure never saw this placement and cannot release it)."""
    names = tables
    add_node(ddb, names, "node-1", gpus=1)
    add_quota(ddb, names, "acme/vision", {"A100": 4000})
    add_pending(ddb, names, "job_gone", gpus=1, token="tok-gone")
    snap = load_snapshot(ddb, names, POOLS, NOW)
    (p,) = run_cycle(snap).placements
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    stub = Stubber(sfn)
    stub.add_client_error("send_task_success", "TaskTimedOut", "Task Timed Out: 'tok-gone'")
    with stub:
        res = store.commit(ddb, names, p, snap.quotas, NOW, sfn=sfn)
    assert not res.ok and res.reason == "token: TaskTimedOut"
    (book,) = [i for i in control_items(ddb, names, "ALLOC#node-1") if i["sk"] == "BOOK"]
    assert all(int(v) == 0 for k, v in book.items() if k.startswith("g") and k[1:].isdigit())
    assert [i["sk"] for i in control_items(ddb, names, "ALLOC#node-1")] == ["BOOK"]  # no allocation record left
    quota = {i["pk"]: i for i in control_items(ddb, names, "QUOTA#")}
    assert all(quota[f"QUOTA#{path}"]["used_all"] == 0 for path in ("acme", "acme/vision", "acme/vision/ann"))
    att = unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk("job_gone"), "sk": attempt_sk(1)}))["Item"])
    assert att["released_at"]
    after = load_snapshot(ddb, names, POOLS, NOW)
    assert after.nodes[0].gpu_free == (1000,) and not after.running


def test_release_gives_everything_back_once(ddb, tables):
    names = tables
    add_node(ddb, names, "node-1", gpus=8)
    add_pending(ddb, names, "job_b", gpus=4)
    snap = load_snapshot(ddb, names, POOLS, NOW)
    (p,) = run_cycle(snap).placements
    assert store.commit(ddb, names, p, snap.quotas, NOW).ok
    assert store.release(ddb, "job_b", 1, names=names, clock=FakeClock(NOW)) is True
    assert store.release(ddb, "job_b", 1, names=names, clock=FakeClock(NOW)) is False
    after = load_snapshot(ddb, names, POOLS, NOW)
    assert after.nodes[0].gpu_free == (1000,) * 8 and not after.running
    assert after.usage["acme/vision/ann"]["A100"] == 0


def test_quota_limit_is_enforced_by_the_transaction(ddb, tables):
    names = tables
    add_node(ddb, names, "node-1", gpus=8)
    add_quota(ddb, names, "acme/vision", {"*": 2000})
    add_pending(ddb, names, "job_c", gpus=2)
    add_pending(ddb, names, "job_d", gpus=1, now=NOW + 1)
    snap = load_snapshot(ddb, names, POOLS, NOW)
    # the pass itself keeps the team within 2 GPUs: only the first job is placed
    result = run_cycle(snap)
    assert [p.job.job_id for p in result.placements] == ["job_c"]
    assert result.status["job_d"].outcome.value == "unschedulable"
    assert store.commit(ddb, names, result.placements[0], snap.quotas, NOW).ok
    # a stale pass that believes the quota is free cannot commit job_d: the condition holds the line
    stale = run_cycle(snap.__class__(**{**snap.__dict__, "jobs": tuple(j for j in snap.jobs if j.job_id == "job_d")}))
    (p,) = stale.placements
    res = store.commit(ddb, names, p, snap.quotas, NOW)
    assert not res.ok and "ConditionalCheckFailed" in res.reason
    assert _job(ddb, names, "job_d")["status"] == "PENDING"


def test_preemption_request_is_fenced_on_the_victims_epoch(ddb, tables):
    names = tables
    add_node(ddb, names, "node-1", gpus=1)
    add_pending(ddb, names, "job_e", gpus=1)
    snap = load_snapshot(ddb, names, POOLS, NOW)
    (p,) = run_cycle(snap).placements
    assert store.commit(ddb, names, p, snap.quotas, NOW).ok
    (victim,) = load_snapshot(ddb, names, POOLS, NOW).running
    assert store.request_preemption(ddb, names, victim, "job_f", NOW + 5)
    job = _job(ddb, names, "job_e")
    assert job["preempt_requested"]["epoch"] == 1 and job["last_preempted_at"] == NOW + 5
    assert load_snapshot(ddb, names, POOLS, NOW + 6).running[0].preempt_requested
    stale = victim.__class__(**{**victim.__dict__, "epoch": 7})
    assert not store.request_preemption(ddb, names, stale, "job_f", NOW + 7)
