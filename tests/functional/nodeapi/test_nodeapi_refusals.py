"""Acceptance: a node acts only on attempts assigned to it at the current epoch, checked server-side.

Through the real path (the node API handler on moto, a Run state that really waits on its task token,
the token stored server-side by the dispatch step), node-b tries to heartbeat, write, complete and fail
node-a's attempt, and node-a tries the same on its own older attempt: every call is refused (403 / 409)
and nothing changed — the job's items are identical and the Run state is still waiting. Then node-a
completes its current attempt and the workflow moves on with the server's report.
"""

from __future__ import annotations

import json
import uuid

import pytest
from attempt_calls import BODIES, SHA, body

from gpufleet.tables import attempt_sk, job_pk


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def test_the_envelope_a_node_receives_carries_no_task_token(world):
    job_id = _job_id()
    arn = world.start(job_id, world.place(job_id, "node-a", 1))
    [msg] = world.node_messages("node-a")
    assert msg["job_id"] == job_id and msg["epoch"] == 1 and "task_token" not in msg
    assert world.attempt(job_id, 1)["run_token"]  # the token lives on the attempt item only
    assert world.execution(arn)["status"] == "RUNNING"


@pytest.mark.parametrize("op", sorted(BODIES))
def test_another_nodes_attempt_is_refused_and_nothing_changes(world, op):
    job_id = _job_id()
    arn = world.start(job_id, world.place(job_id, "node-a", 1))
    before = world.snapshot(job_id)
    status, problem = world.op("node-b", job_id, 1, op, body(op, job_id))
    assert status == 403, problem
    assert problem["type"].endswith("/not-allowed")
    assert world.snapshot(job_id) == before
    assert world.execution(arn)["status"] == "RUNNING"


@pytest.mark.parametrize("op", sorted(BODIES))
def test_an_older_epoch_of_the_own_attempt_is_refused_and_nothing_changes(world, op):
    job_id = _job_id()
    old_arn = world.start(job_id, world.place(job_id, "node-a", 1))
    arn = world.start(job_id, world.new_epoch(job_id, "node-a", 2))
    before = world.snapshot(job_id)
    status, problem = world.op("node-a", job_id, 1, op, body(op, job_id))
    assert status == 409, problem
    assert problem["type"].endswith("/stale-epoch") and problem["current_epoch"] == 2
    assert world.snapshot(job_id) == before
    assert world.execution(arn)["status"] == "RUNNING" and world.execution(old_arn)["status"] == "RUNNING"


def test_callers_that_are_not_nodes_are_refused(world):
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    before = world.snapshot(job_id)
    path = f"/v1/node/jobs/{job_id}/attempts/1/complete"
    for arn in (None, "arn:aws:iam::123456789012:user/alice",  # a tenant
                "arn:aws:sts::123456789012:assumed-role/gpufleet-api/node-a",  # another role, same session name
                "arn:aws:sts::123456789012:assumed-role/gpufleet-agent/NODE_A"):  # not a node id
        status, _ = world.call(None, "POST", path, {"gpu_seconds": 1}, arn=arn)
        assert status == 403
    assert world.call("node-c", "GET", "/v1/node/self")[0] == 403  # a node nobody registered
    assert world.snapshot(job_id) == before


def test_an_unknown_job_or_attempt_is_refused_like_another_nodes(world):
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    assert world.op("node-a", "job-does-not-exist", 1, "heartbeat")[0] == 403
    assert world.op("node-a", job_id, 7, "heartbeat")[0] == 403


def test_the_owner_reports_and_the_workflow_gets_the_servers_report(world):
    job_id = _job_id()
    arn = world.start(job_id, world.place(job_id, "node-a", 1))
    status, view = world.op("node-a", job_id, 1, "heartbeat")
    assert status == 200 and view == {"job_id": job_id, "status": "SCHEDULED", "current_epoch": 1}
    assert "placement_token" not in view and "spec" not in view
    assert world.op("node-a", job_id, 1, "running")[1] == {"moved": True}
    status, view = world.op("node-a", job_id, 1, "progress", {"step": 4, "total": 10})
    assert status == 200 and view["progress"] == {"step": 4, "total": 10} and view["status"] == "RUNNING"
    key = f"jobs/{job_id}/out.bin"
    assert world.op("node-a", job_id, 1, "generated", {"key": key, "sha256": SHA})[0] == 200
    status, _ = world.op("node-a", job_id, 1, "generated", {"key": "jobs/other-job/out.bin", "sha256": SHA})
    assert status == 400  # pointers stay inside the job's own prefix
    status, done = world.op("node-a", job_id, 1, "complete", {"gpu_seconds": 1e9})
    assert status == 200
    d = world.wait_done(arn)
    assert d["status"] == "SUCCEEDED"
    output = json.loads(d["output"])
    assert output["epoch"] == 1 and output["generated"] == {"key": key, "sha256": SHA}
    assert output["gpu_seconds"] < 1e9  # capped at the time since dispatch
    assert world.op("node-a", job_id, 1, "complete", {"gpu_seconds": 1})[0] == 410  # answered once


def test_a_failure_is_reported_with_the_servers_node_and_epoch(world):
    job_id = _job_id()
    arn = world.start(job_id, world.place(job_id, "node-a", 1))
    assert world.op("node-a", job_id, 1, "fail", {"error": "States.Timeout", "detail": "x"})[0] == 400
    status, sent = world.op("node-a", job_id, 1, "fail", {"error": "PREEMPTED", "detail": "drain"})
    assert status == 200 and sent["cause"] == {"epoch": 1, "node": "node-a", "detail": "drain"}
    d = world.wait_done(arn)
    assert d["status"] == "FAILED"
    hist = world.c["stepfunctions"].get_execution_history(executionArn=arn)["events"]
    failed = [e for e in hist if e["type"] == "TaskFailed"]
    assert failed and failed[0]["taskFailedEventDetails"]["error"] == "PREEMPTED"  # (moto drops the cause)


def test_credentials_are_scoped_to_the_attempts_job(world):
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    status, creds = world.op("node-a", job_id, 1, "credentials")
    assert status == 200 and set(creds) == {"access_key_id", "secret_access_key", "session_token", "expiration"}


def test_credentials_never_read_another_tenants_input_even_if_an_attempt_names_it(world, capsys):
    """Defence in depth: admission refuses another tenant's input at submission; should one still reach an
    attempt item (a bug, a hand-written item), the vended session reads only the job's tenant's inputs."""
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    out = world.buckets["outputs"]
    mine, theirs, foreign = (f"s3://{out}/tenants/t1/in.bin", f"s3://{out}/tenants/t2/secret.bin",
                             "s3://someone-elses-bucket/data.bin")
    world.c["dynamodb"].update_item(
        TableName=world.tables.jobs, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": attempt_sk(1)}},
        UpdateExpression="SET inputs = :i", ExpressionAttributeValues={":i": {"L": [{"S": u} for u in
                                                                                  (mine, theirs, foreign)]}})
    vendor = world.api.service.d.credentials
    policies = []
    real = vendor.vend
    vendor.vend = lambda *, session_name, policy: policies.append(policy) or real(session_name=session_name,
                                                                                  policy=policy)
    try:
        status, _creds = world.op("node-a", job_id, 1, "credentials")
    finally:
        vendor.vend = real
    assert status == 200
    (policy,) = policies
    reads = next(st["Resource"] for st in policy["Statement"] if st["Sid"] == "ReadAttemptObjects")
    assert f"arn:aws:s3:::{out}/tenants/t1/in.bin" in reads
    assert not [r for r in reads if "tenants/t2" in r or "someone-elses-bucket" in r], reads
    assert not [r for r in json.dumps(policy).split('"') if r.endswith("*") and "tenants/" in r]  # no wildcard
    withheld = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "inputs_withheld" in line]
    assert withheld and withheld[0]["withheld"] == [theirs, foreign] and withheld[0]["tenant"] == "t1"


def test_dispatch_refuses_a_queue_the_placement_does_not_name(world):
    from gpufleet.errors import NotAllowed
    from gpufleet.nodeapi.dispatch import dispatch

    job_id = _job_id()
    run = world.place(job_id, "node-a", 1)
    run["queue_url"] = world.queues["node-b"]
    with pytest.raises(NotAllowed):
        dispatch(world.runs, lambda *_: None, world.clock, {"job_id": job_id, "token": "t", "run": run})
    assert "run_token" not in world.attempt(job_id, 1)


def test_a_heartbeat_cannot_change_pool_site_or_capacity(world):
    status, problem = world.call("node-a", "POST", "/v1/node/heartbeat", {"pool": "onprem-b"})
    assert status == 400  # not a field a node may report
    report = {"free_milli": {"0": 5000, "1": 500, "7": 1000}, "cpu_milli_free": 10**9, "memory_mib_free": 10**9,
              "accelerator": "nvml", "running_jobs": 1, "ttl_s": 10**6}
    status, item = world.call("node-a", "POST", "/v1/node/heartbeat", report)
    assert status == 200
    assert item["pool"] == "onprem-a" and item["labels"]["site"] == "eu-west" and item["gpu_type"] == "A100"
    assert [g["milli_free"] for g in item["gpus"]] == [1000, 500]  # device 7 is not registered; 5000 → 1000
    assert item["cpu_milli_free"] == 32000 and item["memory_mib_free"] == 256000
    assert item["expires_at"] - int(world.clock.now()) <= world.settings.max_node_ttl_s + 1
    stored = world.nodes.get("node-a")
    assert stored["pool"] == "onprem-a" and stored["queue_url"] == world.queues["node-a"]
    assert world.call("node-c", "POST", "/v1/node/heartbeat", report)[0] == 403  # unregistered


def test_the_node_api_reads_what_it_checks_and_dispatch_records_the_inputs(world):
    # the credentials' readable inputs come from the attempt item (written by the dispatch from the spec), so
    # the node API never reads the spec; its answers carry the view fields only, the write's values merged in
    job_id = _job_id()
    world.start(job_id, world.place(job_id, "node-a", 1))
    assert world.attempt(job_id, 1)["inputs"] == [f"s3://{world.buckets['outputs']}/tenants/t1/in.bin"]
    status, seen = world.op("node-a", job_id, 1, "progress", {"step": 4, "total": 10})
    assert status == 200 and seen["progress"] == {"step": 4, "total": 10}
    assert seen["status"] == "SCHEDULED" and seen["current_epoch"] == 1
    assert not {"spec", "placement_token", "tenant", "run_token"} & set(seen)


def test_a_heartbeats_metrics_become_cloudwatch_metrics_of_the_registered_pool(world, capsys):
    """What the agent measured reaches CloudWatch as EMF on the node API's log stream, under the pool the
    registration binds (not one the node names), clamped to registered GPUs and 0..1, with one
    ``node_metrics`` line naming the node."""
    from gpufleet.metrics import catalog as M
    from gpufleet.metrics.emf import parse_line

    capsys.readouterr()
    report = {"free_milli": {"0": 1000}, "ttl_s": 60,
              "metrics": {"gpu_busy": {"0": 0.25, "1": 1.5, "7": 0.9}, "cache_hits": 3, "cache_misses": 1}}
    assert world.call("node-a", "POST", "/v1/node/heartbeat", report)[0] == 200
    lines = capsys.readouterr().out.splitlines()
    got = {name: (dict(dims), values) for line in lines for _ns, name, dims, values in parse_line(line)}
    pool = {M.POOL: "onprem-a"}
    assert got == {M.NODE_GPU_BUSY.name: (pool, [0.25, 1.0]), M.NODE_CACHE_HITS.name: (pool, [3]),
                   M.NODE_CACHE_MISSES.name: (pool, [1])}
    (logged,) = [json.loads(x) for x in lines if '"event":"node_metrics"' in x]
    assert logged["node"] == "node-a" and logged["pool"] == "onprem-a" and logged["gpu_busy"] == {"0": 0.25, "1": 1.0}
    # no NVML on the node: no utilisation is published (never a made-up 0), the cache counts still are
    report["metrics"] = {"gpu_busy": {}, "cache_hits": 0, "cache_misses": 2}
    assert world.call("node-a", "POST", "/v1/node/heartbeat", report)[0] == 200
    names = {name for line in capsys.readouterr().out.splitlines() for _ns, name, _d, _v in parse_line(line)}
    assert names == {M.NODE_CACHE_HITS.name, M.NODE_CACHE_MISSES.name}
    bad = {**report, "metrics": {"gpu_busy": {}, "cache_hits": -1}}
    assert world.call("node-a", "POST", "/v1/node/heartbeat", bad)[0] == 400
