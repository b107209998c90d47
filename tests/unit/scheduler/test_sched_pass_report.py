"""The pass report (pure, on in-memory stores): capacity left per pool, waits and reasons, and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from sched_strategies import POOLS

from gpufleet.clock import FakeClock
from gpufleet.metrics import RecordingMetrics
from gpufleet.scheduler.capacity import PoolCapacity, pool_capacity
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import Member, NodeState, PendingJob, Snapshot
from gpufleet.scheduler.passes import UNPLACED_REASONS, PassStores, run_pass
from gpufleet.store.placements import CommitResult

BY = {p.name: p for p in POOLS}


def job(jid, pools=("onprem-a",), pending_since=40.0, **kw):
    return PendingJob(jid, "t", "a", "u", created_at=0.0, pending_since=pending_since, cpu_milli=1000,
                      memory_mib=1024, pools=pools, **kw)


def node(nid, free, pool="onprem-a", **kw):
    return NodeState(nid, pool, "A100", tuple(free), 64000, 512_000, **kw)


def test_capacity_after_placements_counts_free_and_fragmented_gpus():
    snap = Snapshot(now=100.0, jobs=(), pools=POOLS, pool_used={"cloud-spot": 2500},
                    nodes=(node("n1", (1000, 1000, 500, 0)), node("n2", (1000,), draining=True),
                           node("n3", (1000,), pool="onprem-b")))
    half = Placement(job("j1", gpu_milli=250), BY["onprem-a"], "A100", (Member("n1", (0,)),), 250)
    cloud = Placement(job("j2", pools=("cloud-spot",)), BY["cloud-spot"], "A10G", (Member(None),), 1000)
    cap = pool_capacity(snap, [half, cloud])
    assert cap["onprem-a"] == PoolCapacity(2.25, 1.25)  # 750 + 1000 + 500 free; 750 and 500 on partly used GPUs
    assert cap["onprem-b"] == PoolCapacity(1.0, 0.0)
    assert cap["cloud-spot"] == PoolCapacity(2.5, 0.0)  # 6 GPUs - 2.5 used - 1 placed


@dataclass
class Stores:
    snap: Snapshot
    lose: set[str] = field(default_factory=set)
    committed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    def load(self, pools, now, shard=None):
        return self.snap

    def escrow(self, lane):
        return {}

    def reserve(self, lane, needs, quotas):
        return needs

    def give_back(self, lane, amounts):
        pass

    def commit_many(self, placements, quotas, now, group=20, lane=None):
        out = []
        for p in placements:
            ok = p.job.job_id not in self.lose
            if ok:
                self.committed.append(p.job.job_id)
            out.append(CommitResult(p.job.job_id, ok, 1, "" if ok else "raced"))
        return out

    def request_preemption(self, victim, by, now):
        return False

    def record_reason(self, job_id, reason):
        self.reasons[job_id] = reason

    def record_backoff(self, job_id, until, reason, shape=""):
        self.reasons[job_id] = reason

    def acquire(self, owner, now, ttl):
        return True

    def release(self, owner):
        pass


def test_the_pass_reports_and_emits_placements_waits_reasons_and_capacity():
    clock = FakeClock(100.0)
    jobs = (job("fits"), job("lost"), job("no-room", num_gpu=3), job("nowhere", pools=("no-such-pool",)))
    nodes = (node("n1", (1000, 1000, 0, 0)),)  # a 4-GPU node with 2 free: 3 GPUs fit it, not now
    stores = Stores(Snapshot(now=100.0, jobs=jobs, pools=POOLS, nodes=nodes), lose={"lost"})
    metrics = RecordingMetrics()
    report = run_pass(PassStores(stores, stores, stores), pools=POOLS, clock=clock, metrics=metrics)
    assert (report.pending, report.considered, report.placed, report.lost) == (4, 4, 1, 1)
    assert report.unplaced == {"unschedulable": 1, "unresolvable": 1, "lost": 1}
    assert report.placed_by_pool == {"onprem-a": 1} and report.waits == {"onprem-a": [60.0]}
    assert report.free_gpus["onprem-a"] == 1.0 and report.fragmented_gpus["onprem-a"] == 0.0

    assert metrics.values("PendingJobs") == [4.0] and metrics.values("JobsConsidered") == [4.0]
    assert metrics.values("Placements") == [1.0, 0.0, 0.0]  # every pool, zeros included
    assert metrics.values("Placements", Pool="onprem-a") == [1.0]
    assert metrics.values("QueueWaitSeconds", Pool="onprem-a") == [60.0] == metrics.values("QueueWaitSeconds")
    assert {r: metrics.values("UnschedulableJobs", Reason=r) for r in UNPLACED_REASONS} == {
        "unschedulable": [1.0], "unresolvable": [1.0], "error": [0.0], "lost": [1.0]}
    assert metrics.values("FreeGpus", Pool="onprem-a") == [1.0] and metrics.values("FreeGpus", Pool="cloud-spot") == [6.0]
    assert len(metrics.values("SchedulerPassSeconds")) == 1
    (event,) = metrics.events
    assert event["event"] == "scheduler_pass" and event["placed"] == 1 and event["unplaced"]["lost"] == 1


def test_a_pass_without_metrics_writes_nothing(capsys):
    stores = Stores(Snapshot(now=100.0, jobs=(), pools=POOLS, nodes=()))
    run_pass(PassStores(stores, stores, stores), pools=POOLS, clock=FakeClock(100.0))
    assert capsys.readouterr().out == ""


def test_a_job_backing_off_keeps_the_reason_of_its_backoff():
    """While a job backs off the cycle says only "backing off": the reason shown to the user (recorded with
    the backoff) must not be overwritten by that."""
    why = "none of the job's pools (no-such-pool) exists; pools: onprem-a"
    jobs = (job("waits", pools=("no-such-pool",), backoff_until=130.0, wait_reason=why),
            job("full", num_gpu=3))
    stores = Stores(Snapshot(now=100.0, jobs=jobs, pools=POOLS, nodes=(node("n1", (1000, 1000, 0, 0)),)))
    run_pass(PassStores(stores, stores, stores), pools=POOLS, clock=FakeClock(100.0))
    assert "waits" not in stores.reasons
    assert stores.reasons["full"] and stores.reasons["full"] != "backing off"
