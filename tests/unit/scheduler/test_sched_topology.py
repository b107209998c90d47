"""Topology-aware GPU choice, end to end in pure code: the agent's NVML topology advertised in its heartbeat,
the node item the node API builds (kept only when it fits the registered GPUs), the scheduler's choice of a
multi-GPU set from it, and the record of what was chosen (placement ``gpu_link``, the status event, ``gpufleet
status``)."""

from __future__ import annotations

from itertools import combinations

from sched_strategies import snapshot

from gpufleet.cli.status import describe
from gpufleet.nodeapi.liveness import LivenessReport, Registration, node_item
from gpufleet.scheduler.cycle import run_cycle
from gpufleet.scheduler.model import PendingJob
from gpufleet.sdk_models import Job
from gpufleet.store.placements import _parts
from gpufleet.store.snapshot import _node_state
from gpufleet.tables import TableNames
from gpufleet.topology import Topology
from onprem_agent.aws import NodeRegistry
from onprem_agent.gpus import Device, Inventory
from onprem_agent.node import node_item as agent_node_item

#: a DGX-like node: two NVLink islands (0-3, 4-7), SYSTEM between them
DGX = Topology.of(range(8), {(a, b): "nvlink" if a // 4 == b // 4 else "system" for a, b in combinations(range(8), 2)})


def _node(node_id: str, free: dict[int, int], topology: Topology | None, registered_gpus: int = 8):
    inv = Inventory(kind="nvml", devices=tuple(Device(i, "NVIDIA A100", 80.0) for i in range(8)), topology=topology)
    item = agent_node_item(
        node_id=node_id,
        pool="onprem-a",
        queue_url="q",
        inventory=inv,
        free_milli=free,
        gpu_type=None,
        cpu_milli_free=64000,
        memory_mib_free=512_000,
        labels={},
        cached_models=[],
        datasets=[],
        now=1000.0,
        ttl_s=60,
        draining=False,
        running_jobs=0,
    )
    reg = Registration(
        node_id=node_id, pool="onprem-a", gpu_type="A100", gpus=registered_gpus, gpu_memory_gb=80, queue_url="q"
    )
    return node_item(reg, LivenessReport.model_validate(NodeRegistry.report(item)), now=1000.0, max_ttl_s=60)


def _job(num_gpu: int, nodes: int = 1) -> PendingJob:
    return PendingJob(
        "j",
        "t",
        "a",
        "u",
        created_at=0.0,
        pending_since=0.0,
        cpu_milli=1000,
        memory_mib=1024,
        num_gpu=num_gpu,
        nodes=nodes,
    )


# GPUs 0 and 1 busy: the lowest free four (2,3,4,5) would straddle the islands; 4-7 share NVLink
FREE = {i: (0 if i in (0, 1) else 1000) for i in range(8)}


def test_a_multi_gpu_job_gets_a_full_nvlink_set_and_the_choice_is_recorded():
    state = _node_state(_node("dgx", FREE, DGX), {})
    assert state.topology == DGX.code()
    r = run_cycle(snapshot((state,), (_job(4),), {}, now=1001.0))
    (p,) = r.placements
    assert p.members[0].gpu_indices == (4, 5, 6, 7) and p.members[0].gpu_link == "nvlink"
    doc = p.to_json(1)
    assert doc["gpu_indices"] == [4, 5, 6, 7] and doc["gpu_link"] == "nvlink"
    parts = _parts(TableNames(), p, 1001.0)
    event = next(
        op["Put"]["Item"] for op in parts.own if "Put" in op and op["Put"]["Item"].get("type", {}).get("S") == "event"
    )
    assert event["detail"]["M"]["gpu_link"] == {"L": [{"S": "nvlink"}]}
    rows = dict(describe(Job.model_validate({"job_id": "j", "status": "SCHEDULED", "placement": doc})))
    assert rows["placement"] == "onprem onprem-a dgx gpus 4,5,6,7 (topology: nvlink) (epoch 1)"


def test_without_a_topology_the_lowest_free_gpus_and_unknown():
    for item in (
        _node("n1", FREE, None),
        _node("n1", FREE, DGX, registered_gpus=6),
    ):  # none, or not the registered GPUs
        state = _node_state(item, {})
        assert state.topology == ""
        (p,) = run_cycle(snapshot((state,), (_job(4),), {}, now=1001.0)).placements
        assert p.members[0].gpu_indices == (2, 3, 4, 5) and p.members[0].gpu_link == "unknown"
    (one,) = run_cycle(snapshot((_node_state(_node("n1", FREE, DGX), {}),), (_job(1),), {}, now=1001.0)).placements
    assert one.members[0].gpu_link == "" and "gpu_link" not in str(_parts(TableNames(), one, 1001.0).own[2])


def test_each_gang_member_records_its_own_link():
    a = _node_state(_node("na", FREE, DGX), {})
    b = _node_state(_node("nb", {i: 1000 for i in range(8)}, None), {})
    (p,) = run_cycle(snapshot((a, b), (_job(2, nodes=2),), {}, now=1001.0)).placements
    links = {m.node: (m.gpu_indices, m.gpu_link) for m in p.members}
    assert links["nb"] == ((0, 1), "unknown") and links["na"][1] == "nvlink"
    doc = p.to_json(1)
    job = Job.model_validate(
        {
            "job_id": "j",
            "status": "RUNNING",
            "placement": doc,
            "members": [
                {"node": m["node"], "rank": r, "gpus": m["gpu_indices"], "state": "running"}
                for r, m in enumerate(doc["members"])
            ],
        }
    )
    rows = dict(describe(job))
    assert rows["member 0"].endswith("(topology: nvlink) running") or rows["member 1"].endswith(
        "(topology: nvlink) running"
    )
    assert "gpus" not in rows["placement"]  # a gang's GPUs are on its member rows
