"""Contract of :class:`gpufleet.store.placements.PlacementStore` (and ``release``), on the fake and on moto.

A placement lands in one transaction or not at all: the job moves PENDING→SCHEDULED at a new epoch only if
it is still at the epoch the snapshot saw; GPU bookings stay <= 1000 milli, cloud pool usage <= ``max_gpus``,
quota usage within each level's limit. A group that loses falls back to one placement at a time, so one
lost race costs only that job. ``release`` gives everything back once. Preemption requests are fenced on
the victim's epoch; backoffs and wait reasons are written only on a still-PENDING job.

The last test runs one seeded random sequence of commits and releases on both backends side by side and
requires the same outcomes and the same counters, so the fake cannot drift from the real store.
"""

from __future__ import annotations

import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from store_backends import memory_backend, moto_backend

from gpufleet.clock import FakeClock
from gpufleet.errors import NotFound
from gpufleet.pools import load_pools
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import Allocation, Member, PendingJob, QuotaNode
from gpufleet.status import JobStatus as S
from gpufleet.tables import BOOK_SK, JOB_META, POOL_SK, QUOTA_SK, alloc_pk, alloc_sk, attempt_sk, job_pk, quota_pk

NOW = 1_780_000_000.0
POOLS = {p.name: p for p in load_pools({})}
ONPREM, CLOUD = POOLS["onprem-a"], POOLS["cloud-ondemand"]
SPEC = {"workload": {"kind": "video.generate", "prompt": "a red kite"}}


def pending(backend, job_id: str) -> PendingJob:
    backend.jobs.create(tenant="t1", team="team", user="u", spec=SPEC, job_id=job_id)
    backend.jobs.transition(job_id, [S.QUEUED], S.PENDING)
    return PendingJob(job_id, "t1", "team", "u")


def onprem(job: PendingJob, gpu: int = 0, milli: int = 1000, node: str = "n1") -> Placement:
    job = dataclasses.replace(job, gpu_milli=milli)
    return Placement(job, ONPREM, "A100", (Member(node, (gpu,), f"q-{node}"),), milli)


def cloud(job: PendingJob, milli: int = 1000) -> Placement:
    return Placement(job, CLOUD, "A10G", (Member(None),), milli)


def control(backend, pk: str, sk: str) -> dict:
    return backend.get_item("control", (pk, sk)) or {}


def test_a_placement_moves_the_job_and_books_everything_then_release_gives_it_back_once(backend):
    job = pending(backend, "j1")
    quotas = {"t1": QuotaNode("t1", {"A100": 4000})}
    (res,) = backend.placements.commit_many([onprem(job, gpu=3, milli=500)], quotas, NOW)
    assert (res.job_id, res.ok, res.epoch) == ("j1", True, 1)
    item = backend.jobs.get("j1")
    assert item["status"] == "SCHEDULED" and item["current_epoch"] == 1 and item["attempt_count"] == 1
    assert item["placement"]["node"] == "n1" and "gsi3pk" not in item
    att = backend.get_item("jobs", (job_pk("j1"), attempt_sk(1)))
    assert att["state"] == "PLACED" and att["charge"]["charge_milli"] == 500
    assert control(backend, alloc_pk("n1"), BOOK_SK)["g3"] == 500
    record = control(backend, alloc_pk("n1"), alloc_sk("j1", 1))
    assert record["gpu_indices"] == [3] and record["owner_path"] == "t1/team/u"
    for path in ("t1", "t1/team", "t1/team/u"):
        q = control(backend, quota_pk(path), QUOTA_SK)
        assert (q["used_A100"], q["used_all"]) == (500, 500)
    assert S.SCHEDULED.value in [e["detail"].get("to") for e in backend.jobs.events("j1")]
    # the same placement again: the job moved on, nothing more is booked
    (again,) = backend.placements.commit_many([onprem(job, gpu=3, milli=500)], quotas, NOW)
    assert not again.ok and again.reason.startswith("lost")
    assert control(backend, alloc_pk("n1"), BOOK_SK)["g3"] == 500
    clock = FakeClock(NOW + 60)
    assert backend.placements.release("j1", 1, clock=clock) is True
    assert backend.placements.release("j1", 1, clock=clock) is False
    assert control(backend, alloc_pk("n1"), BOOK_SK)["g3"] == 0
    assert backend.get_item("control", (alloc_pk("n1"), alloc_sk("j1", 1))) is None
    assert control(backend, quota_pk("t1/team/u"), QUOTA_SK)["used_all"] == 0
    assert backend.get_item("jobs", (job_pk("j1"), attempt_sk(1)))["released_at"]
    with pytest.raises(NotFound):
        backend.placements.release("j1", 2, clock=clock)


def test_a_gang_books_every_member_and_is_released_once_for_all_of_them(backend):
    job = dataclasses.replace(pending(backend, "jg"), num_gpu=2, nodes=2)
    members = (Member("n1", (0, 1), "q-n1"), Member("n2", (0, 1), "q-n2"))
    quotas = {"t1/team": QuotaNode("t1/team", {"*": 1_000_000})}
    (res,) = backend.placements.commit_many([Placement(job, ONPREM, "A100", members, 4000)], quotas, NOW)
    assert res.ok
    for n in ("n1", "n2"):
        book = control(backend, alloc_pk(n), BOOK_SK)
        assert (book["g0"], book["g1"]) == (1000, 1000)
        assert control(backend, alloc_pk(n), alloc_sk("jg", 1))["gpu_indices"] == [0, 1]
    assert control(backend, quota_pk("t1/team"), QUOTA_SK)["used_all"] == 4000
    assert [backend.placements.release("jg", 1, clock=FakeClock(NOW)) for _ in range(3)] == [True, False, False]
    for n in ("n1", "n2"):
        book = control(backend, alloc_pk(n), BOOK_SK)
        assert (book["g0"], book["g1"]) == (0, 0) and backend.get_item("control", (alloc_pk(n), alloc_sk("jg", 1))) is None
    assert control(backend, quota_pk("t1/team"), QUOTA_SK)["used_all"] == 0

def test_a_stale_snapshot_epoch_loses(backend):
    job = pending(backend, "j1")
    backend.jobs.issue_epoch("j1", 0)  # another pass moved the epoch on
    (res,) = backend.placements.commit_many([onprem(job)], {}, NOW)
    assert not res.ok and backend.jobs.get("j1")["status"] == "PENDING"
    assert backend.get_item("control", (alloc_pk("n1"), BOOK_SK)) is None
    assert backend.get_item("control", (quota_pk("t1"), QUOTA_SK)) is None


def test_an_over_booked_gpu_costs_only_the_job_that_loses(backend):
    a, b, c = (pending(backend, j) for j in ("ja", "jb", "jc"))
    results = backend.placements.commit_many([onprem(a, milli=600), onprem(b, milli=600), onprem(c, gpu=1)], {}, NOW)
    assert [(r.job_id, r.ok) for r in results] == [("ja", True), ("jb", False), ("jc", True)]
    book = control(backend, alloc_pk("n1"), BOOK_SK)
    assert (book["g0"], book["g1"]) == (600, 1000)
    assert backend.jobs.get("jb")["status"] == "PENDING"
    # a later pass that sees a booking the snapshot missed loses too
    (late,) = backend.placements.commit_many([onprem(b, milli=500)], {}, NOW)
    assert not late.ok and late.reason.startswith("lost")
    (fits,) = backend.placements.commit_many([onprem(b, milli=400)], {}, NOW)
    assert fits.ok and control(backend, alloc_pk("n1"), BOOK_SK)["g0"] == 1000


def test_quota_limits_hold_across_a_group_and_across_passes(backend):
    quotas = {"t1/team": QuotaNode("t1/team", {"A100": 1000}, {"A100": 500})}  # limit 1500
    a, b = pending(backend, "ja"), pending(backend, "jb")
    results = backend.placements.commit_many([onprem(a, gpu=0), onprem(b, gpu=1)], quotas, NOW)
    assert [r.ok for r in results] == [True, False]
    assert control(backend, quota_pk("t1/team"), QUOTA_SK)["used_A100"] == 1000
    (half,) = backend.placements.commit_many([onprem(b, gpu=1, milli=500)], quotas, NOW)
    assert half.ok and control(backend, quota_pk("t1/team"), QUOTA_SK)["used_A100"] == 1500


def test_a_cloud_pool_never_goes_over_its_size(backend):
    jobs = [pending(backend, f"j{i}") for i in range(3)]
    big = CLOUD.max_gpus * 1000 - 1000
    results = backend.placements.commit_many([cloud(jobs[0], big), cloud(jobs[1], 1000), cloud(jobs[2], 1000)], {}, NOW)
    assert [r.ok for r in results] == [True, True, False]
    assert control(backend, alloc_pk(CLOUD.name), POOL_SK)["used_milli"] == CLOUD.max_gpus * 1000
    assert control(backend, alloc_pk(CLOUD.name), alloc_sk("j0", 1))["pool"] == CLOUD.name
    assert backend.placements.release("j1", 1, clock=FakeClock(NOW)) is True
    assert control(backend, alloc_pk(CLOUD.name), POOL_SK)["used_milli"] == big
    assert backend.get_item("control", (alloc_pk(CLOUD.name), alloc_sk("j1", 1))) is None


def test_a_preemption_request_is_fenced_on_the_victims_epoch(backend):
    job = pending(backend, "j1")
    backend.placements.commit_many([onprem(job)], {}, NOW)
    victim = Allocation("j1", 1, "t1/team/u", 100, ONPREM.name, "A100", (Member("n1", (0,)),), 1000, 1)
    assert backend.placements.request_preemption(dataclasses.replace(victim, epoch=2), "jx", NOW) is False
    assert "preempt_requested" not in backend.jobs.get("j1")
    assert backend.placements.request_preemption(victim, "jx", NOW + 1) is True
    item = backend.jobs.get("j1")
    assert item["preempt_requested"]["by"] == "jx" and item["preempt_requested"]["epoch"] == 1
    assert item["last_preempted_at"] == NOW + 1
    assert control(backend, alloc_pk("n1"), alloc_sk("j1", 1))["preempt_requested"] is True
    backend.placements.release("j1", 1, clock=FakeClock(NOW))  # records gone: the job is still asked
    assert backend.placements.request_preemption(victim, "jy", NOW + 2) is True
    assert backend.get_item("control", (alloc_pk("n1"), alloc_sk("j1", 1))) is None
    assert backend.placements.request_preemption(dataclasses.replace(victim, job_id="nope"), "jx", NOW) is False


def test_backoffs_and_wait_reasons_are_written_only_on_a_pending_job(backend):
    pending(backend, "j1")
    backend.placements.record_backoff("j1", NOW + 30, "x" * 600)
    item = backend.jobs.get("j1")
    assert item["sched_backoff_until"] == NOW + 30 and item["sched_reason"] == "x" * 500
    backend.placements.record_reason("j1", "waiting for capacity")
    assert backend.jobs.get("j1")["sched_reason"] == "waiting for capacity"
    backend.jobs.transition("j1", [S.PENDING], S.CANCELLED)
    backend.placements.record_reason("j1", "quota")
    backend.placements.record_backoff("j1", NOW + 99, "later")
    assert backend.jobs.get("j1")["sched_reason"] == "waiting for capacity"
    backend.placements.record_reason("nope", "quota")  # a missing job: nothing written, nothing raised
    assert backend.get_item("jobs", (job_pk("nope"), JOB_META)) is None
    assert backend.placements.expire("j1", None, "deadline") is False


def test_a_backoff_counts_the_jobs_scheduling_attempts_and_records_its_shape(backend):
    pending(backend, "j1")
    backend.placements.record_backoff("j1", NOW + 30, "no pool", "a1b2c3d4e5f60718")
    item = backend.jobs.get("j1")
    assert (item["sched_attempts"], item["sched_shape"], item["sched_backoff_until"]) == (1, "a1b2c3d4e5f60718", NOW + 30)
    backend.placements.record_backoff("j1", NOW + 90, "plugin failed")  # an ERROR backoff: no shape
    item = backend.jobs.get("j1")
    assert (item["sched_attempts"], item["sched_shape"], item["sched_reason"]) == (2, "", "plugin failed")
    with ThreadPoolExecutor(8) as pool:  # each write adds one, whatever runs beside it
        list(pool.map(lambda i: backend.placements.record_backoff("j1", NOW + i, "x", "f"), range(16)))
    assert backend.jobs.get("j1")["sched_attempts"] == 18
    backend.jobs.transition("j1", [S.PENDING], S.CANCELLED)
    backend.placements.record_backoff("j1", NOW + 99, "later", "g")  # moved on: nothing counted
    item = backend.jobs.get("j1")
    assert (item["sched_attempts"], item["sched_shape"]) == (18, "f")
    backend.placements.record_backoff("nope", NOW, "x", "f")  # a missing job: nothing written, nothing raised
    assert backend.get_item("jobs", (job_pk("nope"), JOB_META)) is None


def _run(backend, seed: int) -> list:
    """A seeded sequence of group commits (GPU, cloud pool and quota contention) and releases; what it observed."""
    rng = random.Random(seed)
    jobs = {f"j{i}": pending(backend, f"j{i}") for i in range(6)}
    quotas = {"t1/team": QuotaNode("t1/team", {"A100": 3000}, {"A100": 1000}, {}),
              "t1": QuotaNode("t1", {"A10G": 3000}, {}, {})}
    placed: list[tuple[str, int]] = []
    epochs = dict.fromkeys(jobs, 0)  # each job's current epoch, as the commits report it
    seen: list = []
    for step in range(8):
        if placed and rng.random() < 0.3:
            job_id, epoch = placed.pop(rng.randrange(len(placed)))
            seen.append(("release", job_id, backend.placements.release(job_id, epoch, clock=FakeClock(NOW + step))))
            continue
        batch = []
        for job_id in rng.sample(sorted(jobs), rng.randint(1, 3)):
            job = dataclasses.replace(jobs[job_id], observed_epoch=epochs[job_id] if rng.random() < 0.8 else 0)
            if rng.random() < 0.25:
                batch.append(cloud(job, rng.choice([1000, 2000, 3000])))
            else:
                batch.append(onprem(job, gpu=rng.randrange(2), milli=rng.choice([250, 500, 1000]), node=rng.choice(["n1", "n2"])))
        results = backend.placements.commit_many(batch, quotas, NOW + step, group=rng.choice([1, 2, 20]))
        seen.append([(r.job_id, r.ok, r.epoch) for r in results])
        for r in results:
            if r.ok:
                placed.append((r.job_id, r.epoch))
                epochs[r.job_id] = r.epoch
                backend.jobs.transition(r.job_id, [S.SCHEDULED], S.PENDING)  # requeued: placed again at a new epoch
    counters = [control(backend, alloc_pk(n), BOOK_SK) for n in ("n1", "n2")]
    counters += [control(backend, quota_pk(p), QUOTA_SK) for p in ("t1", "t1/team", "t1/team/u")]
    counters.append(control(backend, alloc_pk(CLOUD.name), POOL_SK))
    seen.append([{k: v for k, v in c.items() if k.startswith(("g", "used"))} for c in counters])
    seen.append(sorted(backend.jobs.get(j)["status"] for j in jobs))
    return seen


@pytest.mark.parametrize("seed", [11])
def test_fake_and_moto_agree_on_a_random_sequence(seed, clock, ddb, tables):
    memory = _run(memory_backend(type(clock)(clock.now())), seed)
    moto = _run(moto_backend(type(clock)(clock.now()), ddb, tables), seed)
    for i, (m, r) in enumerate(zip(memory, moto, strict=True)):
        assert m == r, f"step {i}: fake {m!r} != moto {r!r}"
    outcomes = [ok for step in memory if isinstance(step, list) and step and isinstance(step[0], tuple) and len(step[0]) == 3
                for _, ok, _ in step]
    assert True in outcomes and False in outcomes  # both wins and lost races were exercised


def test_a_placement_restarts_the_jobs_backoff_and_keeps_its_wait_reason(backend):
    """A placed job's next wait (a retry, a preemption) backs off from the start again; the reason of the wait it
    just ended stays on the item (the diagnosis reads it for this attempt)."""
    job = pending(backend, "j1")
    for i in range(3):
        backend.placements.record_backoff("j1", NOW + i, "no node of that shape", "a1b2c3d4e5f60718")
    (res,) = backend.placements.commit_many([onprem(job)], {"t1": QuotaNode("t1", {"A100": 4000})}, NOW)
    assert res.ok
    item = backend.jobs.get("j1")
    assert "sched_attempts" not in item and "sched_shape" not in item
    assert item["sched_reason"] == "no node of that shape"
