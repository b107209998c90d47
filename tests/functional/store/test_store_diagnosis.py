"""The diagnosis reader (gpufleet.store.diagnosis) on moto: a window's attribution inputs, read back from what
the scheduler, the runtime, billing and the timeline wrote through their own writers."""

from __future__ import annotations

from sched_moto import NOW, add_node, spec

from gpufleet.clock import FakeClock, iso
from gpufleet.diagnose.attribution import Cause, attribute
from gpufleet.lifecycle.billing import Outcome, charge_for
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.status import JobStatus
from gpufleet.store import ledger
from gpufleet.store import placements as store
from gpufleet.store.diagnosis import DynamoDiagnosisReader
from gpufleet.store.dynamo import marshal
from gpufleet.store.jobitem import JobItem
from gpufleet.store.jobs import append_event, build_job, get_job, transition
from gpufleet.store.snapshot import load_snapshot
from gpufleet.tables import DIR_TENANTS, DIRECTORY_ATTR

POOLS = load_pools({})


def _submit(ddb, names, job_id: str, at: float, **kw) -> None:
    """A job submitted and moved to PENDING at ``at`` (the status event the reader finds)."""
    ddb.put_item(TableName=names.jobs, Item=marshal(build_job(job_id, "acme", "vision", "ann", spec(**kw), at - 1)))
    transition(ddb, names.jobs, job_id, [JobStatus.QUEUED], JobStatus.PENDING, clock=FakeClock(at), read_back=False)


def test_the_reader_gives_nodes_bookings_with_marks_and_waits(ddb, tables):
    names = tables
    add_node(ddb, names, "node-1", gpus=2)
    ddb.put_item(TableName=names.control, Item=marshal({"pk": "TENANT#acme", "sk": "TENANT", DIRECTORY_ATTR: DIR_TENANTS}))
    _submit(ddb, names, "job_a", NOW - 20)
    snap = load_snapshot(ddb, names, POOLS, NOW - 10)
    [placed] = run_cycle(snap).placements
    assert store.commit(ddb, names, placed, snap.quotas, NOW - 10).ok
    marks = {"started": NOW - 8, "inputs_staged": NOW - 5, "model_loaded": NOW + 5, "first_step": NOW + 6,
             "generation_done": NOW + 20, "model_cache": "miss"}
    JobItem(names.jobs, "job_a", 1, ddb, clock=FakeClock(NOW)).record_attempt({"phases": marks})
    job = get_job(ddb, names.jobs, "job_a")
    assert ledger.record(ddb, names.jobs, names.ledger, job, 1, charge_for(Outcome.SUCCEEDED, 30.0, 2.0),
                         pool="onprem-a", price=2.0, at=iso(NOW + 25))
    assert store.release(ddb, "job_a", 1, names=names, clock=FakeClock(NOW + 25))
    # a second job still holds a GPU (no marks yet); a third waits, with the scheduler's reason
    _submit(ddb, names, "job_b", NOW + 30)
    snap = load_snapshot(ddb, names, POOLS, NOW + 30)
    [placed] = run_cycle(snap).placements
    assert store.commit(ddb, names, placed, snap.quotas, NOW + 30).ok
    # a fourth job's first attempt failed (its attempt_failed event ends the booking); it waits for its retry
    _submit(ddb, names, "job_d", NOW + 31)
    snap = load_snapshot(ddb, names, POOLS, NOW + 32)
    [placed] = run_cycle(snap).placements
    assert store.commit(ddb, names, placed, snap.quotas, NOW + 32).ok
    append_event(ddb, names.jobs, "job_d", "attempt_failed", {"epoch": 1, "class": "SYSTEM"}, clock=FakeClock(NOW + 36))
    assert store.release(ddb, "job_d", 1, names=names, clock=FakeClock(NOW + 36))
    transition(ddb, names.jobs, "job_d", [JobStatus.SCHEDULED], JobStatus.PENDING, clock=FakeClock(NOW + 36),
               read_back=False)
    _submit(ddb, names, "job_c", NOW + 40, gpus=2)
    store.record_reason(ddb, names, "job_c", "no room")

    reader = DynamoDiagnosisReader(ddb, names)
    inp = reader.window(NOW - 30, NOW + 60)
    assert [(n.node_id, n.pool, n.gpus) for n in inp.nodes] == [("node-1", "onprem-a", 2)]
    by_job = {b.job_id: b for b in inp.bookings}
    a, b = by_job["job_a"], by_job["job_b"]
    assert (a.start, a.end, dict(a.marks)["model_loaded"]) == (NOW - 10, NOW + 25, NOW + 5)
    assert (b.start, b.end, b.marks) == (NOW + 30, None, ())
    assert (by_job["job_d"].start, by_job["job_d"].end) == (NOW + 32, NOW + 36)
    waits = {p.job_id: p for p in inp.pending}
    assert (waits["job_a"].start, waits["job_a"].end) == (NOW - 20, NOW - 10)
    assert (waits["job_c"].end, waits["job_c"].gpus, waits["job_c"].reason) == (None, 2, "no room")
    assert {(p.start, p.end) for p in inp.pending if p.job_id == "job_d"} == {(NOW + 31, NOW + 32), (NOW + 36, None)}
    assert not reader.truncated

    res = attribute(inp)
    secs = {c: ms / 1000 for c, ms in res.totals_ms.items() if ms}
    assert secs[Cause.MODEL_LOAD] == 10 and secs[Cause.STAGING] == 3 and secs[Cause.COMPUTING] == 15
    assert sum(secs.values()) == 90 * 2
    assert reader.window(NOW - 30, NOW + 60, pool="elsewhere").nodes == ()
