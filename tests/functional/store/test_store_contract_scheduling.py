"""Contracts of the scheduler pass's read side — :class:`gpufleet.store.snapshot.SnapshotReader` and
:class:`gpufleet.store.queueview.QueueViewStore` — on the fakes and on moto, and one whole pass over each.

A pass's snapshot holds the PENDING jobs in queue order (priority, then age), cut to ``limit``; every node
with its GPUs' free share after the bookings; every running allocation; the quota nodes with their usage;
the pending jobs' tenants' default placement policy. A job that left PENDING is not in it. The last test
seeds both backends alike and requires equal snapshots, so the fake cannot drift from the DynamoDB reader;
a whole pass (:func:`gpufleet.scheduler.passes.run_pass`) over the fakes and over the DynamoDB stores places
the same jobs on the same GPUs and leaves the same queue view.
"""

from __future__ import annotations

from store_backends import memory_backend, moto_backend

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.context import Placement
from gpufleet.scheduler.model import Member, PendingJob, QuotaNode
from gpufleet.scheduler.passes import run_pass
from gpufleet.scheduler.queueview import QueueView
from gpufleet.status import JobStatus as S
from gpufleet.store.fakes.scheduling import memory_pass_stores
from gpufleet.store.scheduling import pass_stores
from gpufleet.tables import TENANT_SK, tenant_pk

NOW = 1_780_000_100.0
POOLS = load_pools({})
ONPREM = {p.name: p for p in POOLS}["onprem-a"]


def _spec(gpus: float, priority: int, model: str | None = None) -> dict:
    workload = {"kind": "container", "image": "train:1", "command": ["python", "secret.py"], "env": {"K": "v"}}
    if model:
        workload = {"kind": "video.generate", "prompt": "a red kite", "model": model}
    return {"workload": workload, "resources": {"gpus": gpus, "gpu_type": "A100"}, "priority": priority}


def _seed(backend) -> None:
    backend.nodes.put({
        "node_id": "n1", "pool": "onprem-a", "gpu_type": "A100", "queue_url": "q-n1",
        "gpus": [{"index": i, "memory_gb": 80, "milli_free": 1000} for i in range(4)],
        "cpu_milli_free": 64000, "memory_mib_free": 512000, "labels": {"rack": "r1"},
        "cached_models": ["wan-tiny"], "expires_at": int(NOW + 600), "draining": False,
    })
    backend.quotas.put(QuotaNode("t1", {"A100": 4000}, {"A100": 8000}))
    backend.set_attrs("control", (tenant_pk("t1"), TENANT_SK), {"placement_policy": "latency", "webhook_secret": "x"})
    for job_id, gpus, prio, model in (("j-old", 1, 100, None), ("j-urgent", 2, 500, "wan-tiny"),
                                      ("j-young", 0.5, 100, None), ("j-run", 1, 100, None)):
        backend.jobs.create(tenant="t1", team="team", user="u", spec=_spec(gpus, prio, model), job_id=job_id)
        backend.jobs.transition(job_id, [S.QUEUED], S.PENDING)
        backend.clock.advance(1)
    backend.jobs.create(tenant="t1", team="team", user="u", spec=_spec(1, 900), job_id="j-queued")  # not PENDING
    job = PendingJob("j-run", "t1", "team", "u", priority=100)
    placed = Placement(job, ONPREM, "A100", (Member("n1", (2,), "q-n1"),), 1000)
    (res,) = backend.placements.commit_many([placed], {"t1": QuotaNode("t1", {"A100": 4000})}, NOW)
    assert res.ok


def test_a_snapshot_holds_the_queue_nodes_allocations_quotas_and_tenant_defaults(backend):
    _seed(backend)
    snap = backend.snapshot.load(POOLS, NOW)
    assert [j.job_id for j in snap.jobs] == ["j-urgent", "j-old", "j-young"]
    urgent, _, young = snap.jobs
    assert (urgent.num_gpu, urgent.priority, urgent.model, urgent.tenant, urgent.team) == (2, 500, "wan-tiny", "t1", "team")
    assert (young.num_gpu, young.gpu_milli) == (1, 500)
    # the projection carries the workload's kind and image: a tag-only container image never goes to a cloud pool
    assert young.image_pinned is False and urgent.image_pinned is True
    (node,) = snap.nodes
    assert node.gpu_free == (1000, 1000, 0, 1000) and node.cached_models == frozenset({"wan-tiny"})
    assert node.labels == (("rack", "r1"),) and node.queue_url == "q-n1"
    (alloc,) = snap.running
    assert (alloc.job_id, alloc.epoch, alloc.members) == ("j-run", 1, (Member("n1", (2,), "q-n1"),))
    assert snap.quotas["t1"].guarantee == {"A100": 4000} and snap.quotas["t1"].borrow_limit == {"A100": 8000}
    assert snap.usage["t1"]["A100"] == 1000
    assert snap.tenant_policy == {"t1": "latency"}
    assert snap.now == NOW


def test_limit_cuts_the_queue_in_order_and_zero_reads_no_jobs(backend):
    _seed(backend)
    assert [j.job_id for j in backend.snapshot.load(POOLS, NOW, limit=1).jobs] == ["j-urgent"]
    empty = backend.snapshot.load(POOLS, NOW, limit=0)
    assert empty.jobs == () and empty.tenant_policy == {} and len(empty.nodes) == 1


def test_the_pending_projection_leaves_the_command_env_and_prompt_behind(backend):
    _seed(backend)
    reader = backend.snapshot
    # what the reader assembles from: the projected items (the fake projects like the ProjectionExpression)
    if backend.name == "memory":
        items = reader.pending(None)
    else:
        from gpufleet.store.snapshot import _query_pending
        items = _query_pending(reader.client, reader.names.jobs, None)
    assert items and all("command" not in it["spec"].get("workload", {}) for it in items)
    assert all("env" not in it["spec"].get("workload", {}) and "prompt" not in it["spec"].get("workload", {})
               for it in items)


def test_fake_and_moto_read_the_same_snapshot(clock, ddb, tables):
    snaps = []
    for backend in (memory_backend(type(clock)(clock.now())), moto_backend(type(clock)(clock.now()), ddb, tables)):
        _seed(backend)
        snaps.append(backend.snapshot.load(POOLS, NOW))
    memory, moto = snaps
    assert memory == moto


def test_a_queue_view_reads_back_as_written_and_is_overwritten(backend):
    store = backend.snapshot  # the backend's own database: build the queue view store over it
    if backend.name == "memory":
        from gpufleet.store.fakes.queueview import MemoryQueueViewStore
        views = MemoryQueueViewStore(store.db)
    else:
        from gpufleet.store.queueview import DynamoQueueViewStore
        views = DynamoQueueViewStore(store.client, store.names.control)
    assert views.get() is None
    first = QueueView(at=NOW, pending=2, placed=1, pass_interval_s=60.0, jobs={"j1": (1, NOW + 30.5), "j2": (2, None)})
    views.put(first)
    assert views.get() == first
    second = QueueView(at=NOW + 60, pending=0, placed=2, pass_interval_s=60.0)
    views.put(second)
    assert views.get() == second


def test_a_pass_over_the_fakes_places_what_a_pass_over_dynamodb_places(clock, ddb, tables):
    results = []
    for backend in (memory_backend(type(clock)(clock.now())), moto_backend(type(clock)(clock.now()), ddb, tables)):
        _seed(backend)
        stores = (memory_pass_stores(backend.snapshot.db) if backend.name == "memory"
                  else pass_stores(backend.snapshot.client, tables))
        report = run_pass(stores, pools=POOLS, clock=FakeClock(NOW + 5))
        placed = {j: (backend.jobs.get(j)["status"], backend.jobs.get(j).get("placement", {}).get("gpu_indices"))
                  for j in ("j-urgent", "j-old", "j-young")}
        results.append((report.placed, report.lost, report.pending, placed, stores.queue.get().jobs))
    memory, moto = results
    assert memory == moto
    placed, lost, pending, jobs, view = memory
    # three GPUs free: the urgent job takes two, the older one the third; the half-GPU job waits, first in line
    assert (placed, lost, pending) == (2, 0, 3)
    assert jobs["j-urgent"][0] == jobs["j-old"][0] == "SCHEDULED" and jobs["j-young"][0] == "PENDING"
    assert sorted(jobs["j-urgent"][1] + jobs["j-old"][1]) == [0, 1, 3]
    assert list(view) == ["j-young"] and view["j-young"][0] == 1


def test_the_queue_spans_every_pending_partition_the_unsharded_one_included(backend):
    """Jobs are spread over PENDING#<shard> keys; one left in the unsharded ``PENDING`` partition (written before
    sharding) is still read, and the merged queue keeps priority-then-age order across partitions."""
    _seed(backend)
    parts = {backend.jobs.get(j)["gsi3pk"] for j in ("j-old", "j-urgent", "j-young")}
    assert all(p.startswith("PENDING#") for p in parts)
    backend.jobs.create(tenant="t1", team="team", user="u", spec=_spec(1, 300), job_id="j-legacy")
    backend.jobs.transition("j-legacy", [S.QUEUED], S.PENDING)
    item = backend.jobs.get("j-legacy")
    backend.set_attrs("jobs", (item["pk"], item["sk"]), {"gsi3pk": "PENDING"})
    assert [j.job_id for j in backend.snapshot.load(POOLS, NOW).jobs] == ["j-urgent", "j-legacy", "j-old", "j-young"]
    assert [j.job_id for j in backend.snapshot.load(POOLS, NOW, limit=2).jobs] == ["j-urgent", "j-legacy"]
