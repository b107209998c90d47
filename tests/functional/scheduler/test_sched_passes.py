"""One scheduler pass on moto (gpufleet/scheduler/passes.py over the DynamoDB stores): the lease, a
small pass end to end, the scheduler pass Lambda."""

from __future__ import annotations

import pytest
from sched_moto import NOW, add_node, add_pending, control_items

from gpufleet.clock import FakeClock
from gpufleet.errors import ConfigError
from gpufleet.pools import load_pools
from gpufleet.scheduler.passes import run_pass
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.lease import DynamoLease
from gpufleet.store.scheduling import pass_stores
from gpufleet.tables import JOB_META, job_pk

POOLS = load_pools({})


def _job(ddb, names, job_id):
    return unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}))["Item"])


def test_lease_allows_one_pass_at_a_time(aws):
    ddb, names = aws
    lease = DynamoLease(ddb, names.control)
    assert lease.acquire("a", NOW, 60)
    assert not lease.acquire("b", NOW + 1, 60)
    report = run_pass(pass_stores(ddb, names), pools=POOLS, clock=FakeClock(NOW + 2))
    assert report.skipped
    lease.release("b")  # not the owner: no effect
    assert not lease.acquire("b", NOW + 3, 60)
    assert lease.acquire("b", NOW + 61, 60)  # expired lease is taken over
    lease.release("b")
    assert lease.acquire("c", NOW + 62, 60)


def test_small_pass_end_to_end_is_timed(aws):
    """The small sibling of benchmarks/scheduler_pass_moto.py (5,000 jobs x 1,000 nodes)."""
    ddb, names = aws
    for n in range(6):
        add_node(ddb, names, f"node-{n:03d}", gpus=8)
    for i in range(24):
        add_pending(ddb, names, f"job_{i:04d}", gpus=[0.25, 1, 2, 4][i % 4], now=NOW + i)
    report = run_pass(pass_stores(ddb, names), pools=POOLS, clock=FakeClock(NOW + 300))
    total = report.snapshot_s + report.cycle_s + report.commit_s
    print(f"pass over 24 jobs x 6 nodes: {total:.2f}s ({report.as_dict()})")
    assert not report.skipped and report.pending == 24
    assert report.placed + report.lost > 0 and report.lost == 0
    books = [i for i in control_items(ddb, names, "ALLOC#") if i["sk"] == "BOOK"]
    assert all(v <= 1000 for b in books for k, v in b.items() if k.startswith("g") and k[1:].isdigit())


def test_scheduler_pass_lambda_places_a_job(aws, monkeypatch):
    ddb, names = aws
    from lambdas.tasks import scheduler_pass

    monkeypatch.setenv("GPUFLEET_JOBS_TABLE", names.jobs)
    monkeypatch.setenv("GPUFLEET_CONTROL_TABLE", names.control)
    scheduler_pass._clients.cache_clear()
    add_node(ddb, names, "node-1", gpus=2, now=1e10)
    add_pending(ddb, names, "job_l", gpus=1)
    out = scheduler_pass.handler({}, None)
    scheduler_pass._clients.cache_clear()
    assert out["placed"] == 1 and not out["skipped"]
    assert _job(ddb, names, "job_l")["status"] == "SCHEDULED"


def test_scheduler_pass_lambda_takes_its_config_from_the_deployment_setting(aws, monkeypatch):
    ddb, names = aws
    from lambdas.tasks import scheduler_pass

    monkeypatch.setenv("GPUFLEET_JOBS_TABLE", names.jobs)
    monkeypatch.setenv("GPUFLEET_CONTROL_TABLE", names.control)
    add_node(ddb, names, "node-1", gpus=2, now=1e10)
    add_pending(ddb, names, "job_m", gpus=1)
    add_pending(ddb, names, "job_n", gpus=1)
    try:
        monkeypatch.setenv("GPUFLEET_SCHEDULER_CONFIG", '{"queue_sort": "lottery"}')
        scheduler_pass._clients.cache_clear()
        scheduler_pass._config.cache_clear()
        with pytest.raises(ConfigError, match="GPUFLEET_SCHEDULER_CONFIG"):
            scheduler_pass.handler({}, None)
        monkeypatch.setenv("GPUFLEET_SCHEDULER_CONFIG", '{"max_jobs_per_pass": 1}')
        out = scheduler_pass.handler({}, None)
        assert out["pending"] == 2 and out["placed"] == 1  # one job per pass, as configured
    finally:
        scheduler_pass._clients.cache_clear()
        scheduler_pass._config.cache_clear()


def test_a_job_over_its_quota_waits_with_the_reason_shown_once(aws):
    from gpufleet.scheduler.model import QuotaNode
    from gpufleet.store.quotas import put_quota

    ddb, names = aws
    add_node(ddb, names, "node-q", gpus=4)
    put_quota(ddb, names.control, QuotaNode("acme/vision", {"*": 0}))  # a team quota of no GPUs
    add_pending(ddb, names, "job_quota", gpus=1, now=NOW, pools=["onprem-a"])
    stores = pass_stores(ddb, names)
    run_pass(stores, pools=POOLS, clock=FakeClock(NOW + 1))
    job = _job(ddb, names, "job_quota")
    assert job["status"] == "PENDING" and "quota" in job["sched_reason"], job.get("sched_reason")
    ddb.update_item(TableName=names.jobs, Key=marshal({"pk": job_pk("job_quota"), "sk": JOB_META}),
                    UpdateExpression="SET probe = :p", ExpressionAttributeValues={":p": {"S": "x"}})
    run_pass(stores, pools=POOLS, clock=FakeClock(NOW + 2))  # same reason: not written again
    assert _job(ddb, names, "job_quota")["sched_reason"] == job["sched_reason"]
