"""Helpers of the scheduler stores' and the scheduler pass's functional tests: write PENDING jobs, agent
node items and quota nodes into moto as the other components do (imported by module name; the
scheduler's conftest puts this folder on the path)."""

from __future__ import annotations

from gpufleet.scheduler.model import QuotaNode
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus
from gpufleet.store.dynamo import marshal
from gpufleet.store.jobs import build_job
from gpufleet.store.nodes import put_node
from gpufleet.store.quotas import put_quota
from gpufleet.tables import TableNames, pending_partition

NOW = 1_700_000_000.0


def spec(gpus: float = 1, gpu_type: str = "any", nodes: int = 1, priority: int = 100, pools: list[str] | None = None) -> dict:
    s = JobSpec.model_validate(
        {
            # pinned by digest: a tag-only image runs on-prem only (the scheduler's fits-ever filter)
            "workload": {"kind": "container", "image": "train@sha256:" + "ab" * 32, "command": ["python", "train.py"]},
            "resources": {"gpus": gpus, "gpu_type": gpu_type, "nodes": nodes, "cpu": 2, "memory_gb": 8},
            "priority": priority,
            "pools": pools or [],
        }
    )
    return s.model_dump(mode="json")


def add_pending(ddb, names: TableNames, job_id: str, *, tenant="acme", team="vision", user="ann", now=NOW, token=None, attrs=None, **kw) -> None:
    """A PENDING job item; ``attrs`` are extra job item attributes (e.g. ``crashed_workers``)."""
    item = build_job(job_id, tenant, team, user, spec(**kw), now)
    item.update(status=JobStatus.PENDING.value, gsi3pk=pending_partition(job_id), gsi3sk=item["pending_sort"], **(attrs or {}))
    if token:
        item["placement_token"] = token
    ddb.put_item(TableName=names.jobs, Item=marshal(item))


def add_node(ddb, names: TableNames, node_id: str, *, gpus=8, pool="onprem-a", gpu_type="A100", now=NOW) -> None:
    put_node(
        ddb,
        names.control,
        {
            "node_id": node_id,
            "pool": pool,
            "queue_url": f"https://sqs.us-east-1.amazonaws.com/123456789012/gpufleet-node-{node_id}",
            "gpu_type": gpu_type,
            "gpus": [{"index": i, "memory_gb": 80, "milli_free": 1000} for i in range(gpus)],
            "cpu_milli_free": 128000,
            "memory_mib_free": 1024000,
            "labels": {},
            "heartbeat_at": "2023-11-14T22:13:20.000Z",
            "expires_at": int(now + 3600),
            "draining": False,
        },
    )


def add_quota(ddb, names: TableNames, path: str, guarantee: dict, borrow: dict | None = None) -> QuotaNode:
    q = QuotaNode(path, guarantee, borrow or {}, {})
    put_quota(ddb, names.control, q)
    return q


def control_items(ddb, names: TableNames, prefix: str) -> list[dict]:
    from gpufleet.store.dynamo import paginate

    return [i for i in paginate(ddb.scan, TableName=names.control) if i["pk"].startswith(prefix)]
