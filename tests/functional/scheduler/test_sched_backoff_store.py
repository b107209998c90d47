"""UNRESOLVABLE backoffs end to end on moto: a parked job's backoff grows with its own scheduling attempts (one
write per backoff, not one per pass), and a node of its pool registering makes the next pass place it without
waiting for the backoff to end."""

from __future__ import annotations

from sched_moto import NOW, add_node, add_pending

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.passes import run_pass
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.scheduling import pass_stores
from gpufleet.tables import JOB_META, job_pk

POOLS = load_pools({})


def _job(ddb, names, job_id):
    return unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal({"pk": job_pk(job_id), "sk": JOB_META}))["Item"])


def _pass(ddb, names, at: float):
    return run_pass(pass_stores(ddb, names), pools=POOLS, clock=FakeClock(at), use_lease=False)


def test_a_parked_job_backs_off_exponentially_and_is_placed_once_a_node_of_its_pool_registers(aws):
    ddb, names = aws
    add_pending(ddb, names, "job_p", pools=["onprem-a"])  # no node in onprem-a: UNRESOLVABLE
    t = NOW + 10
    report = _pass(ddb, names, t)
    assert (report.placed, report.backoffs, report.unplaced) == (0, 1, {"unresolvable": 1})
    job = _job(ddb, names, "job_p")
    assert job["sched_attempts"] == 1 and job["sched_backoff_until"] == t + 30 and len(job["sched_shape"]) == 16
    assert "onprem-a" in job["sched_reason"]
    shape = job["sched_shape"]

    # passes meanwhile write nothing on it (backing off, same shape)
    for dt in (1, 5, 29):
        report = _pass(ddb, names, t + dt)
        assert (report.backoffs, report.woken) == (0, 0)
    # its backoff ends: judged again, backs off twice as long, still one write
    report = _pass(ddb, names, t + 30)
    job = _job(ddb, names, "job_p")
    assert report.backoffs == 1 and job["sched_attempts"] == 2 and job["sched_backoff_until"] == t + 30 + 60
    report = _pass(ddb, names, t + 90)
    job = _job(ddb, names, "job_p")
    assert report.backoffs == 1 and job["sched_attempts"] == 3 and job["sched_backoff_until"] == t + 90 + 120
    assert job["sched_shape"] == shape

    # a node of another pool changes the shape but not the verdict: judged once more, parked 240 s
    add_node(ddb, names, "node-b", pool="onprem-b", gpu_type="L40S", now=t + 100)
    report = _pass(ddb, names, t + 100)
    job = _job(ddb, names, "job_p")
    assert (report.woken, report.backoffs, job["sched_attempts"]) == (1, 1, 4)
    assert job["sched_backoff_until"] == t + 100 + 240 and job["sched_shape"] != shape
    assert _pass(ddb, names, t + 101).woken == 0

    # a node of its pool registers: the next pass places it, 238 s before its backoff would have ended
    add_node(ddb, names, "node-a", pool="onprem-a", now=t + 102)
    report = _pass(ddb, names, t + 102)
    assert (report.woken, report.placed) == (1, 1), report
    job = _job(ddb, names, "job_p")
    assert job["status"] == "SCHEDULED" and job["placement"]["node"] == "node-a"
