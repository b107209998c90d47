"""Property (issue 14): a gang attempt's GPUs, allocations and quota are given back exactly once for all of its
members, however many of the releasing steps (ClassifyFailure, MarkTerminal, Bill…) call the release and in
whatever order with another gang's release, on moto (gpufleet/store/placements.py ``release``)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sched_moto import NOW, add_node, add_pending, add_quota

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.store import placements as store
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.snapshot import load_snapshot
from gpufleet.tables import BOOK_SK, QUOTA_SK, alloc_pk, quota_pk

POOLS = tuple(p for p in load_pools({}) if p.kind.value == "onprem")
_run = itertools.count()


def _counters(ddb, names, nodes: list[str]) -> tuple[int, dict[tuple[str, int], int], set[str]]:
    """The team's quota usage, the milli booked per (node, GPU) of ``nodes`` and their allocation records' keys
    (``<job>#<epoch>``), read by key."""
    def get(pk: str, sk: str) -> dict:
        return unmarshal(ddb.get_item(TableName=names.control, Key=marshal({"pk": pk, "sk": sk})).get("Item")) or {}

    team = get(quota_pk("acme/vision"), QUOTA_SK)
    books, allocs = {}, set()
    for n in nodes:
        books.update({(n, int(k[1:])): int(v) for k, v in get(alloc_pk(n), BOOK_SK).items()
                      if k[:1] == "g" and k[1:].isdigit()})
        got = ddb.query(TableName=names.control, KeyConditionExpression="pk = :p",
                        ExpressionAttributeValues={":p": {"S": alloc_pk(n)}})["Items"]
        allocs |= {i["sk"]["S"] for i in got} - {BOOK_SK}
    return int(team.get("used_all", 0)), books, allocs


# each example adds its own nodes to one moto table: no shrinking (a failure prints its example as drawn)
@settings(max_examples=3, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=list(HealthCheck))
@given(nodes=st.integers(2, 3), gpus=st.integers(1, 2), calls=st.lists(st.sampled_from("ab"), min_size=2, max_size=5))
def test_a_gangs_quota_and_gpus_are_released_once_for_all_members(ddb, tables, nodes, gpus, calls):
    names, run = tables, next(_run)
    node_ids = [f"n{run}-{i}" for i in range(2 * nodes)]  # room for both gangs
    for n in node_ids:
        add_node(ddb, names, n, gpus=2, now=NOW)
    if run == 0:
        add_quota(ddb, names, "acme/vision", {"*": 1_000_000})
    jobs = {w: f"job_r{run}{w}" for w in "ab"}
    for job_id in jobs.values():
        add_pending(ddb, names, job_id, gpus=gpus, nodes=nodes, pools=["onprem-a"])
    snap = load_snapshot(ddb, names, POOLS, NOW)
    placed = {p.job.job_id: p for p in run_cycle(snap).placements if p.job.job_id in jobs.values()}
    assert set(placed) == set(jobs.values())
    member_nodes = sorted({m.node for p in placed.values() for m in p.members})  # earlier examples' nodes are free too
    before = _counters(ddb, names, member_nodes)[0]
    for p in placed.values():
        assert len(p.members) == nodes and store.commit(ddb, names, p, snap.quotas, NOW).ok
    charge = {w: placed[j].charge_milli for w, j in jobs.items()}
    assert charge["a"] == nodes * gpus * 1000 and _counters(ddb, names, member_nodes)[0] == before + sum(charge.values())
    gpus_of = {w: [(m.node, g) for m in placed[j].members for g in m.gpu_indices] for w, j in jobs.items()}
    assert all(len({n for n, _ in gpus_of[w]}) == nodes for w in "ab")  # one member per node

    released = {"a": 0, "b": 0}
    for w in calls:  # releasing steps of both gangs, interleaved; each release may be repeated
        released[w] += store.release(ddb, jobs[w], 1, names=names, clock=FakeClock(NOW)) is True
        done = {x for x in "ab" if released[x]}
        assert released[w] <= 1  # only the first call of an attempt releases it
        quota, books, allocs = _counters(ddb, names, member_nodes)
        assert quota == before + sum(charge[x] for x in "ab" if x not in done)
        for x in "ab":  # every member's GPUs at once, the other gang's untouched
            want = 0 if x in done else 1000
            assert [books.get(ng, 0) for ng in gpus_of[x]] == [want] * (nodes * gpus)
        assert {x for x in "ab" if any(sk.startswith(f"{jobs[x]}#") for sk in allocs)} == {"a", "b"} - done
    assert {w for w in "ab" if released[w]} == set(calls)
