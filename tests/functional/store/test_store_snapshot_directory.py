"""The scheduler's snapshot and the pools view read the control table by key, never by Scan.

Every writer of a node liveness item, a BOOK/POOL counter, an allocation record or a quota node lists it
in the control table's directory index (gsi2, ``gsi2pk`` = :func:`gpufleet.tables.directory_of`); the
snapshot queries those partitions and reads the pending jobs' tenants by key, projected to their placement
policy, so the webhook secret on the tenant item is never read (gpufleet/store/snapshot.py).
"""

from __future__ import annotations

from sched_moto import NOW, add_node, add_pending, add_quota, control_items

from gpufleet.clock import FakeClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.store import placements as store
from gpufleet.store.dynamo import marshal
from gpufleet.store.snapshot import load_capacity, load_snapshot
from gpufleet.tables import DIRECTORY_ATTR, directory_of

POOLS = load_pools({})


class Recording:
    """A DynamoDB client that records each call's operation and parameters."""

    def __init__(self, client) -> None:
        self._client = client
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        method = getattr(self._client, name)

        def call(**kwargs):
            self.calls.append((name, kwargs))
            return method(**kwargs)

        return call


def _seed(ddb, names) -> None:
    add_node(ddb, names, "node-1", gpus=2)
    add_quota(ddb, names, "acme/vision", {"A100": 4000})
    # the tenant item holds the webhook secret besides the default placement policy
    ddb.put_item(TableName=names.control, Item=marshal(
        {"pk": "TENANT#acme", "sk": "TENANT", "placement_policy": "latency", "webhook_secret": "whsec_x"}))
    ddb.put_item(TableName=names.control, Item=marshal(
        {"pk": "PRINCIPAL#arn:aws:iam::1:user/ann", "sk": "PRINCIPAL", "tenant": "acme"}))
    add_pending(ddb, names, "job_a", gpus=1)
    add_pending(ddb, names, "job_c", gpus=1, pools=["cloud-spot"], now=NOW + 1)


def test_every_listed_item_carries_its_directory_partition_and_nothing_else_does(ddb, tables):
    names = tables
    _seed(ddb, names)
    snap = load_snapshot(ddb, names, POOLS, NOW)
    placements = run_cycle(snap).placements
    assert {p.job.job_id for p in placements} == {"job_a", "job_c"}
    for p in placements:
        assert store.commit(ddb, names, p, snap.quotas, NOW).ok
    items = control_items(ddb, names, "")  # the test may scan; the code under test may not
    kinds = {(i["pk"].split("#")[0], i["sk"] if i["sk"] in ("BOOK", "POOL", "NODE", "QUOTA") else "record")
             for i in items}
    assert {("NODE", "NODE"), ("ALLOC", "BOOK"), ("ALLOC", "POOL"), ("ALLOC", "record"), ("QUOTA", "QUOTA"),
            ("TENANT", "record"), ("PRINCIPAL", "record")} <= kinds
    for i in items:
        assert i.get(DIRECTORY_ATTR) == directory_of(i["pk"], i["sk"]), i
    assert {i[DIRECTORY_ATTR] for i in items if DIRECTORY_ATTR in i} == {
        "DIR#NODES", "DIR#USAGE", "DIR#ALLOCATIONS", "DIR#QUOTAS"}
    # releasing gives the counters back and keeps them listed; the next snapshot sees it all by key
    assert store.release(ddb, "job_a", 1, names=names, clock=FakeClock(NOW))
    after = load_snapshot(ddb, names, POOLS, NOW)
    assert after.nodes[0].gpu_free == (1000, 1000)
    assert [a.job_id for a in after.running] == ["job_c"] and after.pool_used["cloud-spot"] == 1000
    assert after.usage["acme/vision"]["A100"] == 0 and after.quotas["acme/vision"].guarantee == {"A100": 4000}


def test_the_snapshot_queries_the_directory_and_reads_only_the_tenants_policy(ddb, tables):
    names = tables
    _seed(ddb, names)
    rec = Recording(ddb)
    snap = load_snapshot(rec, names, POOLS, NOW)
    assert [n.node_id for n in snap.nodes] == ["node-1"] and {j.job_id for j in snap.jobs} == {"job_a", "job_c"}
    assert snap.tenant_policy == {"acme": "latency"} and "acme/vision" in snap.quotas
    ops = [op for op, _ in rec.calls]
    assert "scan" not in ops
    directory = [kw for op, kw in rec.calls if op == "query" and kw["TableName"] == names.control]
    assert {kw["IndexName"] for kw in directory} == {"gsi2"}
    assert sorted(kw["ExpressionAttributeValues"][":d"]["S"] for kw in directory) == [
        "DIR#ALLOCATIONS", "DIR#NODES", "DIR#POOLS", "DIR#QUOTAS", "DIR#USAGE"]  # POOLS: operators' pools
    (tenant_read,) = [kw for op, kw in rec.calls if op == "batch_get_item"]
    ask = tenant_read["RequestItems"][names.control]
    assert ask["Keys"] == [marshal({"pk": "TENANT#acme", "sk": "TENANT"})]
    assert sorted(ask["ExpressionAttributeNames"].values()) == ["pk", "placement_policy"]


def test_the_pools_view_reads_nodes_and_usage_only(ddb, tables):
    names = tables
    _seed(ddb, names)
    rec = Recording(ddb)
    snap = load_capacity(rec, names, POOLS, NOW)
    assert [n.node_id for n in snap.nodes] == ["node-1"] and not snap.jobs and not snap.tenant_policy
    assert [op for op, _ in rec.calls] == ["query", "query", "query"]
    assert sorted(kw["ExpressionAttributeValues"][":d"]["S"] for _, kw in rec.calls) == [
        "DIR#NODES", "DIR#POOLS", "DIR#USAGE"]
