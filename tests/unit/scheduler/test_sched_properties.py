"""Property tests of the scheduling cycle: quota, GPU booking, gangs, preemption priority, aging."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_strategies import POOLS, allocation, jobs, nodes, quotas, snapshot

from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.framework import SchedulerConfig
from gpufleet.scheduler.model import ALL_TYPES, NodeState, PendingJob, ancestors
from gpufleet.scheduler.quota import QuotaLedger

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(nodes(), jobs(), quotas(), st.integers(0, 3))
def test_quota_is_never_exceeded(ns, js, qs, seed):
    snap = snapshot(ns, js, qs)
    result = run_cycle(snap, seed=seed)
    ledger = QuotaLedger(qs)
    for p in result.placements:
        ledger.charge(p.job.owner_path, p.gpu_type, p.charge_milli)
    for path, q in qs.items():
        for t in {"A100", "L4", "A10G", ALL_TYPES}:
            lim = q.limit(t)
            if lim is not None:
                assert ledger.used(path, t) <= lim, (path, t, ledger.used(path, t), lim)


@FAST
@given(nodes(), jobs(), st.integers(0, 3), st.sampled_from(["frag-aware", "best-fit", "fgd", "random", "packing", "dot-product"]))
def test_no_gpu_is_double_booked_and_node_limits_hold(ns, js, seed, packing):
    snap = snapshot(ns, js, {})
    result = run_cycle(snap, SchedulerConfig(packing=packing), seed=seed)
    by_id = {n.node_id: n for n in ns}
    used = defaultdict(int)
    cpu = defaultdict(int)
    cloud = defaultdict(int)
    for p in result.placements:
        if p.pool.kind.is_cloud:
            cloud[p.pool.name] += p.charge_milli
            continue
        for m in p.members:
            node = by_id[m.node]
            assert node.pool == p.pool.name
            assert len(m.gpu_indices) == p.job.num_gpu == len(set(m.gpu_indices))
            if p.job.gpu_type != "any" and p.job.num_gpu:
                assert node.gpu_type == p.job.gpu_type
            for g in m.gpu_indices:
                used[(m.node, g)] += p.job.gpu_milli
            cpu[m.node] += p.job.cpu_milli
    for (node, g), milli in used.items():
        assert milli <= by_id[node].gpu_free[g], (node, g, milli)
    for node, c in cpu.items():
        assert c <= by_id[node].cpu_milli_free
    for pool in POOLS:
        assert cloud[pool.name] <= pool.max_gpus * 1000


@FAST
@given(nodes(max_nodes=5), jobs(max_jobs=8), st.integers(0, 3))
def test_gangs_are_all_or_nothing(ns, js, seed):
    result = run_cycle(snapshot(ns, js, {}), seed=seed)
    placed = {p.job.job_id: p for p in result.placements}
    for j in js:
        p = placed.get(j.job_id)
        if p is None:
            assert not result.status[j.job_id].ok
            continue
        assert len(p.members) == j.nodes
        nodes_used = [m.node for m in p.members if m.node is not None]
        assert len(nodes_used) == len(set(nodes_used))  # one member per node
    # nothing a failed gang reserved leaks: the pass's bookings equal its placements
    total = sum(p.charge_milli for p in result.placements if not p.pool.kind.is_cloud)
    assert total == sum(p.job.total_gpu_milli for p in result.placements if not p.pool.kind.is_cloud)


@st.composite
def contended(draw):
    """Full nodes with running jobs of mixed priority/owners, and pending jobs that want in."""
    n_nodes = draw(st.integers(1, 3))
    ns = tuple(NodeState(f"n{i}", "onprem-a", "A100", (0, 0, 0, 0), 64000, 512_000) for i in range(n_nodes))
    running = []
    k = 0
    for i in range(n_nodes):
        for g in range(4):
            running.append(
                allocation(
                    f"r{k}",
                    f"t/{draw(st.sampled_from(['a', 'b', 'c']))}/u",
                    draw(st.sampled_from([0, 100, 500])),
                    f"n{i}",
                    [g],
                    started=draw(st.sampled_from([0.0, 50.0, 90.0])),
                    checkpoint=draw(st.sampled_from([None, 95.0])),
                    last_preempted=draw(st.sampled_from([None, None, 80.0, 0.0])),
                )
            )
            k += 1
    pend = tuple(
        PendingJob(f"p{i}", "t", draw(st.sampled_from(["a", "b", "c"])), "u", priority=draw(st.sampled_from([0, 100, 500])),
                   num_gpu=draw(st.sampled_from([1, 2])), gpu_type="A100", created_at=float(i), pending_since=float(i), cpu_milli=1000)
        for i in range(draw(st.integers(1, 4)))
    )
    qs = {}
    for team in ("t/a", "t/b", "t/c"):
        qs[team] = draw(st.sampled_from([None, (2000, 4000), (0, 16000), (4000, 0)]))
    qs = {t: q for t, q in qs.items() if q is not None}
    return ns, pend, running, qs


@FAST
@given(contended())
def test_a_lower_priority_job_never_preempts_a_higher_one(case):
    from gpufleet.scheduler.model import QuotaNode

    ns, pend, running, qraw = case
    qs = {t: QuotaNode(t, {"*": g}, {"*": b}, {}) for t, (g, b) in qraw.items()}
    usage = defaultdict(lambda: defaultdict(int))
    for a in running:
        for path in ancestors(a.owner_path):
            usage[path]["A100"] += a.total_gpu_milli
            usage[path][ALL_TYPES] += a.total_gpu_milli
    snap = snapshot(ns, pend, qs, now=100.0, running=running, usage=usage)
    cfg = SchedulerConfig(preemption_window_s=60.0)
    result = run_cycle(snap, cfg)
    by_id = {j.job_id: j for j in pend}
    victims = [v.job_id for v, _ in result.preemptions]
    assert len(victims) == len(set(victims))  # nobody is preempted twice in one pass
    for victim, for_job in result.preemptions:
        job = by_id[for_job]
        assert victim.priority <= job.priority
        assert victim.last_preempted_at is None or 100.0 - victim.last_preempted_at >= 60.0
    assert not result.placements  # the cluster is full: preemptors wait for the release


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([(1, 250), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]), st.sampled_from([1, 2]),
                          st.sampled_from([0, 100, 900]), st.sampled_from(["a", "b"]), st.integers(1, 5)), min_size=1, max_size=14),
       st.integers(0, 3))
def test_under_bounded_load_every_job_is_eventually_placed(arrivals, seed):
    """Jobs arrive, run for a few passes and finish; with aging every one of them is placed."""
    capacity = [("n0", 8), ("n1", 8), ("n2", 4)]
    pending = {}
    running = {}  # job id -> (finish pass, members, job)
    placed = set()
    quotas_ = {}
    for i, ((k, m), members, prio, team, _) in enumerate(arrivals):
        pending[f"j{i:03d}"] = PendingJob(f"j{i:03d}", "t", team, "u", priority=prio, num_gpu=k, gpu_milli=m, gpu_type="A100",
                                          nodes=members if m == 1000 else 1, cpu_milli=1000, created_at=float(i), pending_since=float(i))
    duration = {f"j{i:03d}": a[4] for i, a in enumerate(arrivals)}
    cfg = SchedulerConfig(aging_per_minute=10.0, starvation_s=120.0, preempt=None)
    limit = 40 * len(arrivals) + 40
    for step in range(limit):
        now = 60.0 * step
        for jid in [j for j, (end, _, _) in running.items() if end <= step]:
            del running[jid]
        free = {n: [1000] * g for n, g in capacity}
        for _, members, job in running.values():
            for node, gpus in members:
                for g in gpus:
                    free[node][g] -= job.gpu_milli
        ns = tuple(NodeState(n, "onprem-a", "A100", tuple(free[n]), 10**6, 10**7) for n, _ in capacity)
        snap = snapshot(ns, tuple(pending.values()), quotas_, now=now)
        snap = snap.__class__(**{**snap.__dict__, "pools": tuple(p for p in POOLS if p.name == "onprem-a")})
        result = run_cycle(snap, cfg, seed=seed)
        for p in result.placements:
            running[p.job.job_id] = (step + duration[p.job.job_id], [(m.node, m.gpu_indices) for m in p.members], p.job)
            placed.add(p.job.job_id)
            del pending[p.job.job_id]
        if not pending:
            break
    assert not pending, f"never placed: {sorted(pending)}"
