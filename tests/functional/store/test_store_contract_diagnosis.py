"""Contract of :class:`gpufleet.store.diagnosis.DiagnosisReader`, on the fake and on moto.

A window's attribution inputs are read back from what the scheduler pass, the runtime (an attempt's phase marks),
billing, the release and the timeline wrote through each backend's own stores: the nodes; a booking per attempt
member, ended by its ledger entry, its ``attempt_failed`` event or nothing while it holds GPUs; the waits before
each placement and the jobs PENDING now with the scheduler's reason. Both backends must read the same inputs.
"""

from __future__ import annotations

from sched_moto import spec

from gpufleet.clock import FakeClock, iso
from gpufleet.diagnose.attribution import Cause, attribute
from gpufleet.lifecycle.billing import Outcome, charge_for
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.status import JobStatus as S
from gpufleet.tables import DIR_TENANTS, DIRECTORY_ATTR, TENANT_SK, attempt_sk, job_pk, tenant_pk

NOW = 1_780_000_100.0
POOLS = load_pools({})


def _at(backend, t: float) -> None:
    backend.clock.t = t


def _submit(backend, job_id: str, at: float, **kw) -> None:
    """A job submitted and moved to PENDING at ``at`` (the status event the reader finds)."""
    _at(backend, at - 1)
    backend.jobs.create(tenant="acme", team="vision", user="ann", spec=spec(**kw), job_id=job_id)
    _at(backend, at)
    backend.jobs.transition(job_id, [S.QUEUED], S.PENDING)


def _place(backend, now: float) -> None:
    snap = backend.snapshot.load(POOLS, now)
    [placed] = run_cycle(snap).placements
    (res,) = backend.placements.commit_many([placed], snap.quotas, now)
    assert res.ok


def test_the_reader_gives_nodes_bookings_with_marks_and_waits(backend):
    backend.nodes.put(
        {
            "node_id": "node-1",
            "pool": "onprem-a",
            "gpu_type": "A100",
            "queue_url": "q-node-1",
            "gpus": [{"index": i, "memory_gb": 80, "milli_free": 1000} for i in range(2)],
            "cpu_milli_free": 128000,
            "memory_mib_free": 1024000,
            "labels": {},
            "expires_at": int(NOW + 3600),
            "draining": False,
        }
    )
    backend.set_attrs("control", (tenant_pk("acme"), TENANT_SK), {DIRECTORY_ATTR: DIR_TENANTS})
    # a job placed and billed before the window: its ledger entry is older than ``since``, so it is not read
    _submit(backend, "job_e", NOW - 110)
    _place(backend, NOW - 100)
    assert backend.ledger.record(
        backend.jobs.get("job_e"),
        1,
        charge_for(Outcome.SUCCEEDED, 10.0, 1.0),
        pool="onprem-a",
        price=2.0,
        at=iso(NOW - 90),
    )
    assert backend.placements.release("job_e", 1, clock=FakeClock(NOW - 90))
    _submit(backend, "job_a", NOW - 20)
    _place(backend, NOW - 10)
    marks = {
        "started": NOW - 8,
        "inputs_staged": NOW - 5,
        "model_loaded": NOW + 5,
        "first_step": NOW + 6,
        "generation_done": NOW + 20,
        "model_cache": "miss",
    }
    backend.set_attrs("jobs", (job_pk("job_a"), attempt_sk(1)), {"phases": marks})  # what the runtime records
    assert backend.ledger.record(
        backend.jobs.get("job_a"),
        1,
        charge_for(Outcome.SUCCEEDED, 30.0, 2.0),
        pool="onprem-a",
        price=2.0,
        at=iso(NOW + 25),
    )
    assert backend.placements.release("job_a", 1, clock=FakeClock(NOW + 25))
    # a second job still holds a GPU (no marks yet); a third waits, with the scheduler's reason
    _submit(backend, "job_b", NOW + 30)
    _place(backend, NOW + 30)
    # a fourth job's first attempt failed (its attempt_failed event ends the booking); it waits for its retry
    _submit(backend, "job_d", NOW + 31)
    _place(backend, NOW + 32)
    _at(backend, NOW + 36)
    backend.jobs.append_event("job_d", "attempt_failed", {"epoch": 1, "class": "SYSTEM"})
    assert backend.placements.release("job_d", 1, clock=FakeClock(NOW + 36))
    backend.jobs.transition("job_d", [S.SCHEDULED], S.PENDING)
    _submit(backend, "job_c", NOW + 40, gpus=2)
    backend.placements.record_reason("job_c", "no room")

    reader = backend.diagnosis
    inp = reader.window(NOW - 30, NOW + 60)
    assert [(n.node_id, n.pool, n.gpus, n.drained) for n in inp.nodes] == [("node-1", "onprem-a", 2, False)]
    assert [it["node_id"] for it in reader.node_items] == ["node-1"]
    by_job = {b.job_id: b for b in inp.bookings}
    assert sorted(by_job) == ["job_a", "job_b", "job_d"] and len(inp.bookings) == 3
    a, b = by_job["job_a"], by_job["job_b"]
    assert (a.start, a.end, dict(a.marks)["model_loaded"]) == (NOW - 10, NOW + 25, NOW + 5)
    assert (b.start, b.end, b.marks) == (NOW + 30, None, ())
    assert (by_job["job_d"].start, by_job["job_d"].end) == (NOW + 32, NOW + 36)
    assert sorted((p.job_id, p.start, p.end, p.gpus, p.reason) for p in inp.pending) == [
        ("job_a", NOW - 20, NOW - 10, 1, ""),  # job_b was placed as it arrived: no wait
        ("job_c", NOW + 40, None, 2, "no room"),
        ("job_d", NOW + 31, NOW + 32, 1, ""),
        ("job_d", NOW + 36, None, 1, ""),
    ]
    assert not reader.truncated

    res = attribute(inp)
    secs = {c: ms / 1000 for c, ms in res.totals_ms.items() if ms}
    assert secs[Cause.MODEL_LOAD] == 10 and secs[Cause.STAGING] == 3 and secs[Cause.COMPUTING] == 15

    assert reader.window(NOW - 30, NOW + 60, pool="cloud-spot").nodes == ()
    assert reader.node_items == []

    reader.max_jobs = 2  # the most recent first: those holding GPUs or waiting again, then the billed ones
    capped = reader.window(NOW - 30, NOW + 60)
    assert reader.truncated and sorted(b.job_id for b in capped.bookings) == ["job_b", "job_d"]
