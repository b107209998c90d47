"""Property (issue 14): a gang attempt's GPUs, allocations and quota are given back exactly once for all of its
members, however many of the releasing steps (ClassifyFailure, MarkTerminal, Bill…) call the release and in
whatever order with another gang's release, on the in-memory placement store
(:class:`gpufleet.store.fakes.placements.MemoryPlacementStore`, held to the DynamoDB store's contract by
``tests/functional/store/test_store_contract_placements.py``, which releases a gang on moto too)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.model import NodeState, PendingJob, QuotaNode, Snapshot
from gpufleet.status import JobStatus
from gpufleet.store.fakes.jobs import MemoryJobStore
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.placements import MemoryPlacementStore
from gpufleet.tables import BOOK_SK, QUOTA_SK, alloc_pk, quota_pk

NOW = 1_700_000_000.0
POOLS = tuple(p for p in load_pools({}) if p.kind.value == "onprem")
SPEC = {"workload": {"kind": "container", "image": "train:1", "command": ["python", "train.py"]}}


def _counters(db: MemoryDatabase, nodes: list[str]) -> tuple[int, dict[tuple[str, int], int], set[str]]:
    """The team's quota usage, the milli booked per (node, GPU) of ``nodes`` and their allocation records' keys
    (``<job>#<epoch>``), read by key."""
    def get(pk: str, sk: str) -> dict:
        return db.get("control", (pk, sk)) or {}

    team = get(quota_pk("acme/vision"), QUOTA_SK)
    books, allocs = {}, set()
    for n in nodes:
        books.update({(n, int(k[1:])): int(v) for k, v in get(alloc_pk(n), BOOK_SK).items()
                      if k[:1] == "g" and k[1:].isdigit()})
        allocs |= {sk for (pk, sk) in db.table("control") if pk == alloc_pk(n)} - {BOOK_SK}
    return int(team.get("used_all", 0)), books, allocs


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(nodes=st.integers(2, 3), gpus=st.integers(1, 2), calls=st.lists(st.sampled_from("ab"), min_size=2, max_size=5))
def test_a_gangs_quota_and_gpus_are_released_once_for_all_members(nodes, gpus, calls):
    db, clock = MemoryDatabase(), FakeClock(NOW)
    job_store, store = MemoryJobStore(db, clock), MemoryPlacementStore(db)
    node_ids = [f"n{i}" for i in range(2 * nodes)]  # room for both gangs
    free = [NodeState(n, "onprem-a", "A100", (1000, 1000), 128_000, 1_024_000) for n in node_ids]
    quotas = {"acme/vision": QuotaNode("acme/vision", {"*": 1_000_000})}
    jobs = {w: f"job_{w}" for w in "ab"}
    pending = []
    for job_id in jobs.values():
        job_store.create(tenant="acme", team="vision", user="ann", spec=SPEC, job_id=job_id)
        job_store.transition(job_id, [JobStatus.QUEUED], JobStatus.PENDING)
        pending.append(PendingJob(job_id, "acme", "vision", "ann", num_gpu=gpus, nodes=nodes, cpu_milli=2000,
                                  memory_mib=8192, pools=("onprem-a",)))
    snap = Snapshot(NOW, tuple(pending), tuple(free), POOLS, quotas)
    placed = {p.job.job_id: p for p in run_cycle(snap).placements if p.job.job_id in jobs.values()}
    assert set(placed) == set(jobs.values())
    member_nodes = sorted({m.node for p in placed.values() for m in p.members})
    before = _counters(db, member_nodes)[0]
    for p in placed.values():
        assert len(p.members) == nodes and store.commit_many([p], snap.quotas, NOW)[0].ok
    charge = {w: placed[j].charge_milli for w, j in jobs.items()}
    assert charge["a"] == nodes * gpus * 1000 and _counters(db, member_nodes)[0] == before + sum(charge.values())
    gpus_of = {w: [(m.node, g) for m in placed[j].members for g in m.gpu_indices] for w, j in jobs.items()}
    assert all(len({n for n, _ in gpus_of[w]}) == nodes for w in "ab")  # one member per node

    released = {"a": 0, "b": 0}
    for w in calls:  # releasing steps of both gangs, interleaved; each release may be repeated
        released[w] += store.release(jobs[w], 1, clock=FakeClock(NOW)) is True
        done = {x for x in "ab" if released[x]}
        assert released[w] <= 1  # only the first call of an attempt releases it
        quota, books, allocs = _counters(db, member_nodes)
        assert quota == before + sum(charge[x] for x in "ab" if x not in done)
        for x in "ab":  # every member's GPUs at once, the other gang's untouched
            want = 0 if x in done else 1000
            assert [books.get(ng, 0) for ng in gpus_of[x]] == [want] * (nodes * gpus)
        assert {x for x in "ab" if any(sk.startswith(f"{jobs[x]}#") for sk in allocs)} == {"a", "b"} - done
    assert {w for w in "ab" if released[w]} == set(calls)
