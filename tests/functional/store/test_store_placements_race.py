"""Two scheduler passes racing over the same snapshot on moto never overcommit.

Both passes see the same free capacity and quota; their commits are interleaved in
several orders. The DynamoDB conditions (GPU bookings <= 1000 milli, quota usage <=
limit, job still PENDING at the epoch the snapshot saw) must hold the line.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from sched_moto import NOW, add_node, add_pending, add_quota, control_items

from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.store import placements as store
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.snapshot import load_snapshot

POOLS = tuple(p for p in load_pools({}) if p.kind.value == "onprem")


def _interleave(a, b, order):
    if order == "a-first":
        return [("a", x) for x in a] + [("b", x) for x in b]
    if order == "b-first":
        return [("b", x) for x in b] + [("a", x) for x in a]
    out = []
    for i in range(max(len(a), len(b))):
        out += [("a", a[i])] if i < len(a) else []
        out += [("b", b[i])] if i < len(b) else []
    return out


def _check_invariants(ddb, names, quota_limit):
    allocs = [i for i in control_items(ddb, names, "ALLOC#") if i["sk"] not in ("BOOK", "POOL")]
    per_gpu = defaultdict(int)
    for a in allocs:
        for g in a["gpu_indices"]:
            per_gpu[(a["node"], g)] += a["gpu_milli"]
    assert per_gpu and max(per_gpu.values()) <= 1000, per_gpu
    books = {i["pk"][6:]: i for i in control_items(ddb, names, "ALLOC#") if i["sk"] == "BOOK"}
    for (node, g), milli in per_gpu.items():
        assert books[node][f"g{g}"] == milli  # bookings agree with the allocation records
    team = next(i for i in control_items(ddb, names, "QUOTA#acme/vision") if i["pk"] == "QUOTA#acme/vision")
    assert team["used_all"] <= quota_limit
    assert team["used_all"] == sum(a["gpu_milli"] * len(a["gpu_indices"]) for a in allocs)
    jobs = [unmarshal(i) for i in ddb.scan(TableName=names.jobs)["Items"]]
    scheduled = [j for j in jobs if j.get("sk") == "META" and j["status"] == "SCHEDULED"]
    assert all(j["current_epoch"] == 1 for j in scheduled)
    attempts = [j for j in jobs if j.get("sk", "").startswith("ATTEMPT#")]
    assert len(attempts) == len(scheduled) == len({a["job_id"] for a in allocs})
    return len(scheduled)


@pytest.mark.parametrize("order", ["a-first", "b-first", "alternate"])
def test_racing_passes_over_disjoint_jobs_never_overcommit(ddb, tables, order):
    """Each pass places its own jobs onto the same free GPUs (shares and whole GPUs)."""
    names = tables
    for n in range(3):
        add_node(ddb, names, f"node-{n}", gpus=2)
    add_quota(ddb, names, "acme/vision", {"*": 3000}, {"*": 2000})
    shapes = [0.5, 1, 0.25, 2, 1, 0.5]
    for i, g in enumerate(shapes):
        add_pending(ddb, names, f"job_a{i}", gpus=g, now=NOW + i)
        add_pending(ddb, names, f"job_b{i}", gpus=g, now=NOW + i)
    snap = load_snapshot(ddb, names, POOLS, NOW + 10)
    only = lambda prefix: snap.__class__(**{**snap.__dict__, "jobs": tuple(j for j in snap.jobs if j.job_id.startswith(prefix))})  # noqa: E731
    plan_a = run_cycle(only("job_a"), seed=1).placements
    plan_b = run_cycle(only("job_b"), seed=2).placements
    assert plan_a and plan_b
    assert sum(p.charge_milli for p in plan_a) + sum(p.charge_milli for p in plan_b) > 5000  # together they would overcommit
    won = {"a": 0, "b": 0}
    for who, p in _interleave(plan_a, plan_b, order):
        if store.commit(ddb, names, p, snap.quotas, NOW + 10).ok:
            won[who] += 1
    placed = _check_invariants(ddb, names, quota_limit=5000)
    assert placed == won["a"] + won["b"] and won["a"] + won["b"] < len(plan_a) + len(plan_b)


def test_racing_passes_over_the_same_jobs_place_each_job_once(ddb, tables):
    names = tables
    for n in range(2):
        add_node(ddb, names, f"node-{n}", gpus=4)
    add_quota(ddb, names, "acme/vision", {"*": 8000})
    for i in range(6):
        add_pending(ddb, names, f"job_{i}", gpus=[1, 0.5, 2][i % 3], now=NOW + i)
    snap = load_snapshot(ddb, names, POOLS, NOW + 10)
    plan_a = run_cycle(snap, seed=3).placements
    plan_b = run_cycle(snap, seed=4).placements
    results_a = store.commit_many(ddb, names, plan_a, snap.quotas, NOW + 10, group=3)
    results_b = store.commit_many(ddb, names, plan_b, snap.quotas, NOW + 10, group=3)
    assert all(r.ok for r in results_a) and not any(r.ok for r in results_b)
    assert _check_invariants(ddb, names, quota_limit=8000) == len(plan_a)
