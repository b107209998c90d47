"""Locality over staged inputs, end to end in pure code: the agent's report of an input staged in its cache,
the node item the node API builds from it (bounded far below DynamoDB's 400 KB whatever a node sends), the
scheduler's node state, and a locality job placed on the node that holds its input."""

from __future__ import annotations

import json

from sched_strategies import snapshot

from gpufleet.nodeapi.liveness import LivenessReport, Registration, node_item
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.model import PendingJob
from gpufleet.store.snapshot import _node_state
from onprem_agent.aws import NodeRegistry
from onprem_agent.gpus import Device, Inventory
from onprem_agent.node import node_item as agent_node_item

INPUT = "s3://tenant-data/tenants/t/clip.bin?versionId=v3"


def _reported(node_id: str, advertised: list[str], **report) -> dict:
    """The scheduler's view of a node whose agent advertised ``advertised`` as datasets, through the node API."""
    inv = Inventory(kind="nvml", devices=tuple(Device(i, "NVIDIA A100", 80.0) for i in range(4)))
    item = agent_node_item(
        node_id=node_id,
        pool="onprem-a",
        queue_url="q",
        inventory=inv,
        free_milli={i: 1000 for i in range(4)},
        gpu_type=None,
        cpu_milli_free=64000,
        memory_mib_free=512_000,
        labels={},
        cached_models=[],
        datasets=advertised,
        now=1000.0,
        ttl_s=60,
        draining=False,
        running_jobs=0,
    )
    body = {**NodeRegistry.report(item), **report}
    reg = Registration(node_id=node_id, pool="onprem-a", gpu_type="A100", gpus=4, gpu_memory_gb=80, queue_url="q")
    return node_item(reg, LivenessReport.model_validate(body), now=1000.0, max_ttl_s=60)


def test_a_locality_job_goes_to_the_node_holding_its_staged_input():
    holder = _node_state(_reported("holder", [INPUT]), {})
    other = _node_state(_reported("other", ["s3://tenant-data/tenants/t/clip.bin"]), {})  # another version
    assert INPUT in holder.datasets
    job = PendingJob(
        "j",
        "t",
        "a",
        "u",
        created_at=0.0,
        pending_since=0.0,
        cpu_milli=1000,
        memory_mib=1024,
        policy="locality",
        inputs=(INPUT,),
    )
    for nodes in ((other, holder), (holder, other)):
        r = run_cycle(snapshot(nodes, (job,), {}, now=1001.0))
        assert r.placements[0].members[0].node == "holder"


def test_a_node_item_stays_far_below_400_kb_whatever_the_node_reports():
    big = {
        "datasets": [f"s3://b/{i:04d}" + "k" * 1010 for i in range(1024)],
        "cached_models": [f"m{i:04d}" + "x" * 250 for i in range(4096)],
        "resident_models": [f"r{i:03d}" + "x" * 250 for i in range(256)],
    }
    item = _reported("n1", [], **big)
    assert len(json.dumps(item)) < 160_000
    assert 60 <= len(item["datasets"]) and all(len(u) <= 1024 for u in item["datasets"])
    assert len(item["cached_models"]) >= 250 and len(item["resident_models"]) >= 60
    over = _reported("n1", [], datasets=["s3://b/" + "k" * 1100, "s3://b/ok"])
    assert over["datasets"] == ["s3://b/ok"]  # longer than any spec's input: it could match no job
