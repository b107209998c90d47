"""Hypothesis strategies shared by the scheduler's unit tests (imported by module name)."""

from __future__ import annotations

from hypothesis import strategies as st

from gpufleet.pools import parse_pools
from gpufleet.scheduler.model import Allocation, Member, NodeState, PendingJob, QuotaNode, Snapshot

POOLS = parse_pools(
    [
        {"name": "onprem-a", "kind": "onprem", "region": "eu", "gpu_type": "A100", "max_gpus": 64, "price_per_gpu_hour": 0.5},
        {"name": "onprem-b", "kind": "onprem", "region": "us", "gpu_type": "L4", "max_gpus": 64, "price_per_gpu_hour": 0.3},
        {"name": "cloud-spot", "kind": "spot", "region": "eu", "gpu_type": "A10G", "max_gpus": 6, "price_per_gpu_hour": 0.4,
         "job_queue": "q-spot", "job_definition": "jd"},
    ]
)
TEAMS = ["t/a", "t/b", "t/c"]
SHAPES = [(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (8, 1000), (0, 0)]


@st.composite
def nodes(draw, max_nodes: int = 6):
    out = []
    for i in range(draw(st.integers(1, max_nodes))):
        pool = draw(st.sampled_from(["onprem-a", "onprem-b"]))
        n = draw(st.sampled_from([1, 2, 4, 8]))
        free = tuple(draw(st.sampled_from([0, 250, 500, 1000, 1000])) for _ in range(n))
        out.append(NodeState(f"n{i}", pool, "A100" if pool == "onprem-a" else "L4", free, draw(st.sampled_from([8000, 32000, 96000])), 512_000))
    return tuple(out)


@st.composite
def jobs(draw, max_jobs: int = 12, gangs: bool = True):
    out = []
    for i in range(draw(st.integers(1, max_jobs))):
        k, m = draw(st.sampled_from(SHAPES))
        team = draw(st.sampled_from(TEAMS))
        out.append(
            PendingJob(
                f"j{i:03d}",
                "t",
                team.split("/")[1],
                draw(st.sampled_from(["u1", "u2"])),
                priority=draw(st.sampled_from([0, 100, 500])),
                created_at=float(i),
                pending_since=float(i),
                num_gpu=k,
                gpu_milli=m,
                gpu_type=draw(st.sampled_from(["any", "any", "A100", "L4", "A10G"])),
                cpu_milli=draw(st.sampled_from([1000, 4000, 12000])),
                memory_mib=8192,
                nodes=draw(st.sampled_from([1, 1, 1, 2, 3])) if gangs and k >= 1 and m == 1000 else 1,
                residency=draw(st.sampled_from([(), (), ("eu",)])),
            )
        )
    return tuple(out)


@st.composite
def quotas(draw):
    out = {}
    for team in TEAMS:
        if draw(st.booleans()):
            g = draw(st.sampled_from([0, 1000, 4000]))
            b = draw(st.sampled_from([0, 2000, 8000]))
            key = draw(st.sampled_from(["*", "A100"]))
            out[team] = QuotaNode(team, {key: g}, {key: b}, {"*": draw(st.sampled_from([1.0, 2.0]))})
    if draw(st.booleans()):
        out["t"] = QuotaNode("t", {"*": draw(st.sampled_from([4000, 16000]))}, {"*": 0}, {})
    return out


def snapshot(nodes_, jobs_, quotas_, now: float = 100.0, running=(), usage=None) -> Snapshot:
    return Snapshot(now=now, jobs=jobs_, nodes=nodes_, pools=POOLS, quotas=quotas_, running=tuple(running), usage=usage or {})


def job(jid, **kw):
    """One pending job with small defaults (a 1-core, 1 GiB request); ``kw`` over them."""
    base = dict(tenant="t", team="a", user="u", created_at=0.0, pending_since=0.0, cpu_milli=1000, memory_mib=1024)
    base.update(kw)
    return PendingJob(jid, **base)


def node(nid, free=(1000,) * 4, pool="onprem-a", gpu_type="A100", **kw):
    """One on-prem node (4 free GPUs of A100 in onprem-a by default)."""
    return NodeState(nid, pool, gpu_type, tuple(free), 64000, 512_000, **kw)


def allocation(job_id, owner, priority, node, gpus, milli=1000, started=0.0, checkpoint=None, last_preempted=None, gpu_type="A100", pool="onprem-a"):
    return Allocation(job_id, 1, owner, priority, pool, gpu_type, (Member(node, tuple(gpus)),), milli, len(gpus),
                      started_at=started, checkpoint_at=checkpoint, last_preempted_at=last_preempted)
