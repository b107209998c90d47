"""Sharded passes on moto: the quota escrow's conditional writes, two shards that read before either committed
(sharing nodes, a tenant quota and a cloud pool) never overdraw nor place twice, and the Lambda runs the shard its
event names."""

from __future__ import annotations

from dataclasses import replace

import pytest
from botocore.exceptions import ClientError
from sched_moto import NOW, add_node, add_pending, control_items

from gpufleet.clock import FakeClock
from gpufleet.errors import ConfigError
from gpufleet.pools import parse_pools
from gpufleet.scheduler.model import QuotaNode
from gpufleet.scheduler.passes import run_pass
from gpufleet.scheduler.shards import PassShard
from gpufleet.store import escrow
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.placements import DynamoPlacementStore
from gpufleet.store.quotas import put_quota
from gpufleet.store.scheduling import pass_stores
from gpufleet.tables import JOB_META, QUOTA_SK, job_pk, quota_pk

POOLS = parse_pools([
    {"name": "onprem-a", "kind": "onprem", "region": "eu", "gpu_type": "A100", "max_gpus": 512, "price_per_gpu_hour": 0.5},
    {"name": "cloud-spot", "kind": "spot", "region": "eu", "gpu_type": "A10G", "max_gpus": 2, "price_per_gpu_hour": 0.4,
     "job_queue": "q-spot", "job_definition": "jd"},
])


def _used(ddb, names, path):
    item = unmarshal(ddb.get_item(TableName=names.control, Key=marshal({"pk": quota_pk(path), "sk": QUOTA_SK}))
                     .get("Item")) or {}
    return int(item.get("used_all", 0))


def test_escrow_reserves_within_the_limit_and_gives_back(aws):
    ddb, names = aws
    quotas = {"acme": QuotaNode("acme", {"*": 4000})}
    put_quota(ddb, names.control, quotas["acme"])
    store = DynamoPlacementStore(ddb, names)
    assert store.reserve("0of1.0", {"acme": {"*": 3000, "A100": 3000}}, quotas) == {"acme": {"*": 3000, "A100": 3000}}
    # a second lane asks 3 more: only 1 is left under the limit (the "*" limit bounds every type), and that is
    # what it gets
    assert store.reserve("0of1.1", {"acme": {"*": 3000, "A100": 3000}}, quotas) == {"acme": {"*": 1000, "A100": 1000}}
    assert _used(ddb, names, "acme") == 4000
    assert store.escrow("0of1.1") == {"acme": {"*": 1000, "A100": 1000}}
    with pytest.raises(Exception, match="give-back refused"):
        store.give_back("0of1.0", {"acme": {"*": 5000}})  # more than it holds: refused, nothing moves
    store.give_back("0of1.0", {"acme": {"*": 3000, "A100": 3000}})
    store.give_back("0of1.1", store.escrow("0of1.1"))
    assert _used(ddb, names, "acme") == 0 and store.escrow("0of1.0") == {} and store.escrow("0of1.1") == {}


def test_a_transaction_cancelled_only_by_a_conflict_is_tried_again():
    def conflict(code="TransactionCanceledException", reasons=("None", "TransactionConflict")):
        return ClientError({"Error": {"Code": code, "Message": "x"},
                            "CancellationReasons": [{"Code": r} for r in reasons]}, "TransactWriteItems")

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise conflict()
        return "ok"

    assert escrow.retry_conflicts(flaky, sleep=lambda s: None) == "ok" and len(calls) == 3
    with pytest.raises(ClientError):  # a failed condition is not retried: the job is decided again
        escrow.retry_conflicts(lambda: (_ for _ in ()).throw(conflict(reasons=("ConditionalCheckFailed",))),
                               sleep=lambda s: None)
    assert escrow.is_conflict(conflict(code="TransactionConflictException", reasons=()))


def test_two_shards_reading_before_either_commits_never_overdraw(aws):
    """Both shards believe a different round, so they may own the same nodes and jobs; both read their snapshot
    before either commits. Tenant quota 5 GPUs, cloud pool 2 GPUs, 3 nodes of 2 GPUs, 12 one-GPU jobs."""
    ddb, names = aws
    put_quota(ddb, names.control, QuotaNode("acme", {"*": 5000}))
    for n in range(3):
        add_node(ddb, names, f"node-{n}", gpus=2, now=NOW)
    for i in range(12):
        add_pending(ddb, names, f"job_{i:03d}", gpus=1, now=NOW + i, pools=["onprem-a", "cloud-spot"])
    shards = [PassShard(0, 2, 0), PassShard(1, 2, 1)]
    snaps = [pass_stores(ddb, names, shard=s).snapshot.load(POOLS, NOW + 60, shard=s) for s in shards]

    class Taken:
        def __init__(self, snap):
            self.snap = snap

        def load(self, pools, now, *, limit=None, shard=None):
            return self.snap

    reports = [run_pass(replace(pass_stores(ddb, names, shard=s), snapshot=Taken(snap)), pools=POOLS,
                        clock=FakeClock(NOW + 60), shard=s, lanes=2) for s, snap in zip(shards, snaps, strict=True)]
    placed = [i for i in range(12) if unmarshal(ddb.get_item(TableName=names.jobs, Key=marshal(
        {"pk": job_pk(f"job_{i:03d}"), "sk": JOB_META}))["Item"])["status"] == "SCHEDULED"]
    assert sum(r.placed for r in reports) == len(placed) <= 5
    assert _used(ddb, names, "acme") == 1000 * len(placed)
    items = control_items(ddb, names, "ALLOC#")
    assert all(v <= 1000 for b in items if b["sk"] == "BOOK" for k, v in b.items() if k[:1] == "g" and k[1:].isdigit())
    assert all(int(b.get("used_milli", 0)) <= 2000 for b in items if b["sk"] == "POOL")
    escrows = control_items(ddb, names, "ESCROW#")
    assert escrows and all(escrow.amounts_from_item(e) == {} for e in escrows)  # nothing left held


def test_the_lambda_runs_the_shard_its_event_names(aws, monkeypatch):
    ddb, names = aws
    from lambdas.tasks import scheduler_pass

    monkeypatch.setenv("GPUFLEET_JOBS_TABLE", names.jobs)
    monkeypatch.setenv("GPUFLEET_CONTROL_TABLE", names.control)
    monkeypatch.setenv("GPUFLEET_SCHEDULER_SHARDS", "2")
    monkeypatch.setenv("GPUFLEET_SCHEDULER_WRITE_PARALLELISM", "1")  # moto's transactions are not thread-safe
    add_node(ddb, names, "node-1", gpus=2, now=1e10)
    add_node(ddb, names, "node-2", gpus=2, now=1e10)
    for i in range(6):
        add_pending(ddb, names, f"job_s{i}", gpus=1)
    scheduler_pass._clients.cache_clear()
    scheduler_pass._config.cache_clear()
    try:
        outs = [scheduler_pass.handler({"shard": i}, None) for i in (0, 1)]
        assert [o["shard"]["index"] for o in outs] == [0, 1] and all(o["shard"]["count"] == 2 for o in outs)
        assert sum(o["pending"] for o in outs) == 6  # each job read by one shard
        assert sum(o["placed"] for o in outs) >= 1
        with pytest.raises(ConfigError, match="shard"):
            scheduler_pass.handler({"shard": 2}, None)
    finally:
        scheduler_pass._clients.cache_clear()
        scheduler_pass._config.cache_clear()
