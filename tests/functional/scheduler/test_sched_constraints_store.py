"""Placement constraints end to end on moto: the pool allowlist and failed-node avoidance are read
from the stored job item (through the pending index's projection) and honoured by a real pass."""

from __future__ import annotations

from sched_moto import NOW, add_node, add_pending

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.passes import run_pass
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.scheduling import pass_stores
from gpufleet.store.snapshot import load_snapshot
from gpufleet.tables import JOB_META, job_pk

POOLS = load_pools({})


def _job(ddb, names, job_id):
    return unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}))["Item"])


def test_snapshot_carries_allowlist_and_failed_nodes(aws):
    ddb, names = aws
    add_pending(ddb, names, "job_a", pools=["cloud-spot", "onprem-a"],
                attrs={"crashed_workers": {"node-1"}, "failed_nodes": {"node-2", "node-3"}})
    add_pending(ddb, names, "job_b")
    jobs = {j.job_id: j for j in load_snapshot(ddb, names, POOLS, NOW).jobs}
    assert jobs["job_a"].pools == ("cloud-spot", "onprem-a")
    assert jobs["job_a"].avoid_nodes == {"node-1", "node-2", "node-3"}
    assert jobs["job_b"].pools == () and jobs["job_b"].avoid_nodes == frozenset()


def test_pass_places_on_the_allowlisted_pool_and_off_the_failed_node(aws):
    ddb, names = aws
    add_node(ddb, names, "node-1", gpus=8)
    add_node(ddb, names, "node-2", gpus=8)
    add_pending(ddb, names, "job_cloud", pools=["cloud-ondemand"])
    add_pending(ddb, names, "job_retry", gpus=8, attrs={"crashed_workers": {"node-1"}})
    add_pending(ddb, names, "job_lost", gpus=8, attrs={"failed_nodes": {"node-2"}}, now=NOW + 1)
    report = run_pass(pass_stores(ddb, names), pools=POOLS, clock=FakeClock(NOW + 10), use_lease=False)
    assert report.placed == 3, report
    assert _job(ddb, names, "job_cloud")["placement"]["pool"] == "cloud-ondemand"
    assert _job(ddb, names, "job_retry")["placement"]["node"] == "node-2"
    assert _job(ddb, names, "job_lost")["placement"]["node"] == "node-1"


def test_allowlist_of_unknown_pools_records_the_reason_on_the_job(aws):
    ddb, names = aws
    add_node(ddb, names, "node-1", gpus=8)
    add_pending(ddb, names, "job_x", pools=["onprem-zz"])
    report = run_pass(pass_stores(ddb, names), pools=POOLS, clock=FakeClock(NOW + 10), use_lease=False)
    assert report.placed == 0 and report.backoffs == 1
    job = _job(ddb, names, "job_x")
    assert job["status"] == "PENDING" and job["sched_backoff_until"] > NOW + 10
    assert "onprem-zz" in job["sched_reason"] and "onprem-a" in job["sched_reason"]
