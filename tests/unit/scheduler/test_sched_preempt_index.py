"""The indexed preemption (candidate index, table trials, ledger overlays) decides exactly as the plain scan.

``ScanPreempt`` below is the ``reclaim`` plugin as it was before the index: it scans every
running allocation for every job that does not fit and copies the node table and the quota
ledger per job. Whole passes over random contended clusters (two on-prem pools and a cloud
pool, gangs, GPU shares, a three-level quota tree with guarantees and borrowing, allocations
already being preempted, recently preempted ones, allocations on nodes that are gone) must
produce identical results — placements, victims, statuses, requeues — with either plugin,
for every packing policy (the random ones consume the pass's generator in the same order).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_strategies import POOLS

from gpufleet.pools import Pool
from gpufleet.scheduler.candidates import CandidateIndex
from gpufleet.scheduler.context import PassContext
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import Framework, SchedulerConfig
from gpufleet.scheduler.model import (
    ALL_TYPES,
    Allocation,
    Member,
    NodeState,
    PendingJob,
    QuotaNode,
    Snapshot,
    ancestors,
)
from gpufleet.scheduler.nodetable import NodeTable
from gpufleet.scheduler.preempt import ReclaimPreempt
from gpufleet.scheduler.quota import QuotaLedger
from gpufleet.scheduler.results import Outcome, Status


def _team(path: str) -> str:
    return "/".join(path.split("/")[:2])


class ScanPreempt:
    """Reference: the ``reclaim`` preemption as a plain scan (the code before the index)."""

    def eligible(self, job, victim, reclaim, borrowing, gpu_type, ledger, ctx) -> bool:
        if victim.priority > job.priority:
            return False
        if victim.last_preempted_at is not None and ctx.now - victim.last_preempted_at < ctx.settings.preemption_window_s:
            return False
        if reclaim:
            if victim.owner_path not in borrowing:
                borrowing[victim.owner_path] = ledger.borrowed_at(victim.owner_path, gpu_type)
            if borrowing[victim.owner_path]:
                return True
        return victim.priority < job.priority and _team(victim.owner_path) == _team(job.owner_path)

    def _free(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int]) -> None:
        for m in a.members:
            table.release(index[m.node], m.gpu_indices, a.request)
        ledger.refund(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _take(self, a: Allocation, table: NodeTable, ledger: QuotaLedger, index: dict[str, int]) -> None:
        for m in a.members:
            table.allocate(index[m.node], m.gpu_indices, a.request)
        ledger.charge(a.owner_path, a.gpu_type, a.total_gpu_milli)

    def _fits(self, job: PendingJob, pool: Pool, table: NodeTable, ledger: QuotaLedger, ctx: PassContext) -> bool:
        if ledger.violation(job.owner_path, pool.gpu_type, ctx.charge_milli(job, pool)) is not None:
            return False
        trial = table.copy()
        req = job.request
        for _ in range(job.nodes):
            c = ctx.packer.choose(trial, req, ctx.rng, ctx.mix)
            if c is None:
                return False
            trial.allocate(c.node, c.gpus, req)
            trial.blocked[c.node] = True
        return True

    def victims(self, job: PendingJob, pools: list[Pool], ctx: PassContext):
        for pool in pools:
            if pool.kind.is_cloud or pool.name not in ctx.tables:
                continue
            index = ctx.node_index[pool.name]
            need = ctx.charge_milli(job, pool)
            table = ctx.tables[pool.name].copy()
            ledger = ctx.ledger.copy()
            here = [a for a in ctx.running if a.pool == pool.name and all(m.node in index for m in a.members)]
            freed = 0
            for a in here:
                if a.job_id in ctx.preempting:
                    self._free(a, table, ledger, index)
                    freed += 1
            if self._fits(job, pool, table, ledger, ctx):
                if freed:
                    return [], Status(Outcome.UNSCHEDULABLE, "waiting for capacity being preempted")
                return [], None
            reclaim = ledger.within_guarantee(job.owner_path, pool.gpu_type, need)
            borrowing: dict[str, bool] = {}
            cands = [
                a
                for a in here
                if a.job_id not in ctx.preempting and self.eligible(job, a, reclaim, borrowing, pool.gpu_type, ledger, ctx)
            ]
            cands.sort(key=lambda a: (a.lost_work_s(ctx.now), a.priority, -a.started_at, a.job_id))
            chosen: list[Allocation] = []
            for a in cands:
                self._free(a, table, ledger, index)
                chosen.append(a)
                if self._fits(job, pool, table, ledger, ctx):
                    break
            else:
                continue
            for a in sorted(chosen, key=lambda a: -a.lost_work_s(ctx.now)):
                self._take(a, table, ledger, index)
                if self._fits(job, pool, table, ledger, ctx):
                    chosen.remove(a)
                else:
                    self._free(a, table, ledger, index)
            return chosen, Status(Outcome.UNSCHEDULABLE, f"preempting {len(chosen)} job(s) in {pool.name}")
        return [], Status(Outcome.UNSCHEDULABLE, "no capacity and no eligible victims")


TEAMS = ["t/a", "t/b", "t/c", "s/a"]
OWNERS = [f"{t}/{u}" for t in TEAMS for u in ("u1", "u2")]
NOW = 1000.0


@st.composite
def clusters(draw):
    """Nodes partly or fully held by running allocations (consistent free capacity), pending jobs, quotas."""
    nodes, running, k = [], [], 0
    n_nodes = draw(st.integers(1, 6))
    free_by_node: dict[str, list[int]] = {}
    for i in range(n_nodes):
        pool = draw(st.sampled_from(["onprem-a", "onprem-a", "onprem-b"]))
        free = [1000] * draw(st.sampled_from([2, 4, 8]))
        node = f"n{i}"
        free_by_node[node] = free
        for g in range(len(free)):
            for milli in draw(st.sampled_from([[1000], [1000], [1000], [500, 500], [250, 250, 500], [500], []])):
                free[g] -= milli
                running.append((k, pool, [(node, (g,))], milli))
                k += 1
        nodes.append((node, pool))
    # a few gangs (whole GPUs on distinct nodes of one pool)
    for _ in range(draw(st.integers(0, 2))):
        pool = draw(st.sampled_from(["onprem-a", "onprem-b"]))
        members = []
        for node, p in nodes:
            gs = [g for g, f in enumerate(free_by_node[node]) if f == 1000]
            if p == pool and gs and len(members) < 2:
                free_by_node[node][gs[0]] = 0
                members.append((node, (gs[0],)))
        if members:
            running.append((k, pool, members, 1000))
            k += 1
    allocs, usage = [], defaultdict(lambda: defaultdict(int))
    for k, pool, members, milli in running:
        gone = draw(st.integers(0, 19)) == 0  # a member on a node missing from the snapshot
        owner = draw(st.sampled_from(OWNERS))
        gpu_type = "A100" if pool == "onprem-a" else "L4"
        a = Allocation(
            f"r{k:03d}", 1, owner, draw(st.sampled_from([0, 0, 100, 500])), pool, gpu_type,
            tuple(Member("gone" if gone else n, gs) for n, gs in members), milli, 1,
            cpu_milli=draw(st.sampled_from([0, 1000, 4000])), memory_mib=1024,
            started_at=draw(st.sampled_from([0.0, 500.0, 900.0, 990.0])),
            checkpoint_at=draw(st.sampled_from([None, None, 995.0, 950.0])),
            last_preempted_at=draw(st.sampled_from([None, None, None, 800.0, 100.0])),
            preempt_requested=draw(st.integers(0, 9)) == 0,
        )
        allocs.append(a)
        for p in ancestors(owner):
            usage[p][gpu_type] += a.total_gpu_milli
            usage[p][ALL_TYPES] += a.total_gpu_milli
    node_states = tuple(
        NodeState(n, p, "A100" if p == "onprem-a" else "L4", tuple(free_by_node[n]), draw(st.sampled_from([4000, 16000, 64000])), 512_000)
        for n, p in nodes
    )
    quotas = {}
    for path in ["t", "s", *TEAMS, *OWNERS]:
        if draw(st.booleans()):
            key = draw(st.sampled_from(["*", "A100", "L4"]))
            quotas[path] = QuotaNode(path, {key: draw(st.sampled_from([0, 500, 1000, 4000]))},
                                     {key: draw(st.sampled_from([0, 2000, 64000]))}, {})
    jobs = []
    for i in range(draw(st.integers(1, 10))):
        k_gpu, milli = draw(st.sampled_from([(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000)]))
        owner = draw(st.sampled_from(OWNERS)).split("/")
        jobs.append(PendingJob(
            f"p{i}", owner[0], owner[1], owner[2], priority=draw(st.sampled_from([0, 100, 500, 900])),
            created_at=float(i), pending_since=float(draw(st.sampled_from([0, 990]))), num_gpu=k_gpu, gpu_milli=milli,
            gpu_type=draw(st.sampled_from(["A100", "A100", "L4", "any"])), cpu_milli=draw(st.sampled_from([1000, 4000])), memory_mib=1024,
            nodes=draw(st.sampled_from([1, 1, 2])) if milli == 1000 else 1,
        ))
    snap = Snapshot(now=NOW, jobs=tuple(jobs), nodes=node_states, pools=POOLS, quotas=quotas,
                    usage={p: dict(v) for p, v in usage.items()}, running=tuple(allocs))
    return snap


def _decisions(result) -> tuple:
    placements = [(p.job.job_id, p.pool.name, p.members, p.charge_milli) for p in result.placements]
    victims = [(v.job_id, by) for v, by in result.preemptions]
    return placements, victims, result.status, result.requeue, result.order


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(clusters(), st.sampled_from(["frag-aware", "best-fit", "random", "fgd"]), st.sampled_from([0.0, 300.0]), st.integers(0, 3))
def test_indexed_preemption_decides_as_the_plain_scan(snap, packing, window, seed):
    cfg = SchedulerConfig(packing=packing, preemption_window_s=window)
    indexed = run_cycle(snap, cfg, seed=seed)
    scan = run_cycle(snap, dataclasses.replace(Framework.from_config(cfg), preempt=ScanPreempt()), seed=seed)
    assert _decisions(indexed) == _decisions(scan)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(clusters(), st.integers(0, 3))
def test_victims_leave_the_pass_state_as_it_was(snap, seed):
    """A preemption what-if changes neither the pool tables nor the ledger it worked over, even when it raises."""
    fw = Framework.from_config(SchedulerConfig())
    ctx = PassContext(snap, fw.config, fw.packer, seed)
    before = {p: (t.cpu.copy(), t.mem.copy(), t.gpu.copy(), t.state_id.copy(), t.blocked.copy()) for p, t in ctx.tables.items()}
    usage = ctx.ledger.copy().usage
    for job in snap.jobs:
        try:
            ReclaimPreempt().victims(job, list(snap.pools), ctx)
        except ValueError:  # taking back a victim on a CPU-tight node (docs/scheduler.md): the cycle's ERROR
            pass
    for p, t in ctx.tables.items():
        for a, b in zip(before[p], (t.cpu, t.mem, t.gpu, t.state_id, t.blocked), strict=True):
            assert (a == b).all()
    assert {p: {k: v for k, v in d.items() if v} for p, d in ctx.ledger.usage.items()} == {
        p: {k: v for k, v in d.items() if v} for p, d in usage.items()
    }


def _alloc(job_id: str, owner: str, priority: int, node: str = "n0", last_preempted_at: float | None = None) -> Allocation:
    return Allocation(job_id, 1, owner, priority, "onprem-a", "A100", (Member(node, (0,)),), 1000, 1, last_preempted_at=last_preempted_at)


def test_the_index_answers_by_team_priority_and_borrowing_path():
    running = [
        _alloc("a-low", "t/a/u1", 0),
        _alloc("a-same", "t/a/u2", 100),
        _alloc("b-low", "t/b/u1", 0),
        _alloc("b-recent", "t/b/u1", 0, last_preempted_at=990.0),
        _alloc("c-high", "t/c/u1", 500),
        _alloc("elsewhere", "t/a/u1", 0, node="not-in-pool"),
    ]
    idx = CandidateIndex(running, {"onprem-a": {"n0": 0}}, set(), {"t/b", "t/c"}, NOW, 60.0)
    ids = lambda allocs: sorted(a.job_id for a in allocs)  # noqa: E731
    assert ids(idx.eligible("onprem-a", "t/a/u9", 100, False, lambda q: True)) == ["a-low"]
    assert ids(idx.eligible("onprem-a", "t/a/u9", 100, True, lambda q: q == "t/b")) == ["a-low", "b-low"]
    assert ids(idx.eligible("onprem-a", "t/a/u9", 500, True, lambda q: True)) == ["a-low", "a-same", "b-low", "c-high"]
    idx.mark("b-low")
    assert [a.job_id for a in idx.freeing("onprem-a")] == ["b-low"]
    assert ids(idx.eligible("onprem-a", "t/a/u9", 500, True, lambda q: True)) == ["a-low", "a-same", "c-high"]
    assert idx.eligible("onprem-b", "t/a/u9", 500, True, lambda q: True) == []


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_trial_restores_the_table_exactly(nodes):
    from gpufleet.scheduler.nodetable import Request

    t = NodeTable(["x", "y"], ["A100", "A100"], [8000, 8000], [1000, 1000], [2, 2], gpu_free=[[1000, 250], [0, 1000]])
    saved = (t.cpu.copy(), t.gpu.copy(), t.state_id.copy())
    with t.trial():
        t.release(0, (1,), Request(4000, 0, 1, 750))  # capped CPU: not the inverse of the allocate below
        with t.trial():
            t.allocate(nodes - 1, (1,), Request(1000, 0, 1, 1000 if nodes == 2 else 500))
        t.allocate(0, (0,), Request(8000, 0, 1, 1000))
    assert (t.cpu == saved[0]).all() and (t.gpu == saved[1]).all() and (t.state_id == saved[2]).all()
