"""Benchmark: one scheduler pass over 5,000 PENDING jobs and 1,000 nodes on moto.

    .venv/bin/python benchmarks/scheduler_pass_moto.py [--jobs 5000] [--nodes 1000] [--quota-teams 20]

Writes the jobs (as the API/lifecycle do: PENDING with gsi3 keys), agent node items
(8 × A100 each) and team quotas into moto's DynamoDB, then times ``run_pass``:
snapshot load, the pure cycle, and the commits (one TransactWriteItems per placement).

moto 5.2.5's ``transact_write_items`` deep-copies every table it touches once per
item, for rollback; at this size that alone would take hours. With ``--fast-rollback``
(the default) the script swaps that backup for a backup of only the items the
transaction touches, restored the same way on cancellation — the same all-or-nothing
semantics at O(items) cost. ``--moto-stock`` keeps moto as shipped (use a small --jobs).
Prints figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from gpufleet.clock import FakeClock  # noqa: E402
from gpufleet.pools import load_pools  # noqa: E402
from gpufleet.scheduler.model import QuotaNode  # noqa: E402
from gpufleet.scheduler.passes import run_pass  # noqa: E402
from gpufleet.spec import JobSpec  # noqa: E402
from gpufleet.status import JobStatus  # noqa: E402
from gpufleet.store.dynamo import marshal  # noqa: E402
from gpufleet.store.jobs import build_job  # noqa: E402
from gpufleet.store.quotas import put_quota  # noqa: E402
from gpufleet.store.scheduling import pass_stores  # noqa: E402
from gpufleet.store.schema import create_tables  # noqa: E402
from gpufleet.tables import DIR_NODES, DIRECTORY_ATTR, TableNames, node_pk, pending_partition  # noqa: E402

NOW = 1_700_000_000.0


def install_fast_rollback() -> None:
    """Back up only the touched items in moto's transact_write_items (semantics unchanged)."""
    import moto.dynamodb.models as models
    from moto.dynamodb.models.table import Table

    class _Copy:
        @staticmethod
        def deepcopy(obj, memo=None):
            return obj if isinstance(obj, Table) else copy.deepcopy(obj, memo)

    stock = models.DynamoDBBackend.transact_write_items
    if getattr(stock, "_fast_rollback", False):
        return

    def transact_write_items(self, transact_items):
        backup = []
        for item in transact_items:
            op_type, op = next(iter(item.items()))
            name = op.get("TableName")
            if name not in self.tables:
                continue
            table = self.tables[name]
            if op_type == "Put":
                key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
                if table.range_key_attr:
                    key[table.range_key_attr] = op["Item"][table.range_key_attr]
            else:
                key = op["Key"]
            cur = self.get_item(name, key)
            backup.append((name, key, None if cur is None else copy.deepcopy(cur.to_json()["Attributes"])))
        saved = models.copy
        models.copy = _Copy
        try:
            return stock(self, transact_items)
        except Exception:
            for name, key, old in reversed(backup):
                if old is None:
                    if self.get_item(name, key) is not None:
                        self.delete_item(name, key)
                else:
                    self.put_item(name, old)
            raise
        finally:
            models.copy = saved

    transact_write_items._fast_rollback = True
    models.DynamoDBBackend.transact_write_items = transact_write_items


def batch_put(ddb, table: str, items: list[dict]) -> None:
    for i in range(0, len(items), 25):
        req = {table: [{"PutRequest": {"Item": marshal(it)}} for it in items[i : i + 25]]}
        while req:
            req = ddb.batch_write_item(RequestItems=req).get("UnprocessedItems") or None


def seed_items(n_jobs: int, n_nodes: int, teams: int) -> tuple[list[dict], list[dict], list[QuotaNode]]:
    """PENDING job items (gsi3 keys, as the lifecycle leaves them), agent node items (8 × A100) and team quotas."""
    specs = {}
    for g in (0.25, 0.5, 1, 2, 4, 8):
        specs[g] = JobSpec.model_validate(
            {
                "workload": {"kind": "container", "image": "train:1", "command": ["python", "train.py"]},
                "resources": {"gpus": g, "cpu": 4 * max(1, g), "memory_gb": 16 * max(1, g)},
            }
        ).model_dump(mode="json")
    mix = [0.25, 0.5, 1, 1, 1, 1, 2, 2, 4, 8]
    jobs = []
    for i in range(n_jobs):
        team = f"team{i % teams:02d}"
        job_id = f"job_{i:06d}"
        item = build_job(job_id, "acme", team, f"user{i % 7}", specs[mix[i % len(mix)]], NOW + i * 0.01)
        item.update(status=JobStatus.PENDING.value, gsi3pk=pending_partition(job_id), gsi3sk=item["pending_sort"])
        jobs.append(item)
    nodes = []
    for n in range(n_nodes):
        nodes.append(
            {
                "pk": node_pk(f"node-{n:05d}"),
                "sk": "NODE",
                DIRECTORY_ATTR: DIR_NODES,
                "node_id": f"node-{n:05d}",
                "pool": "onprem-a",
                "queue_url": f"https://sqs.us-east-1.amazonaws.com/123456789012/gpufleet-node-node-{n:05d}",
                "gpu_type": "A100",
                "gpus": [{"index": i, "memory_gb": 80, "milli_free": 1000} for i in range(8)],
                "cpu_milli_free": 128000,
                "memory_mib_free": 1024000,
                "expires_at": int(NOW + 3600),
                "draining": False,
            }
        )
    share = n_nodes * 8 * 1000 // teams
    quotas = [QuotaNode(f"acme/team{t:02d}", {"*": share}, {"*": share}, {}) for t in range(teams)]
    return jobs, nodes, quotas


def seed(ddb, names: TableNames, n_jobs: int, n_nodes: int, teams: int) -> None:
    jobs, nodes, quotas = seed_items(n_jobs, n_nodes, teams)
    batch_put(ddb, names.jobs, jobs)
    batch_put(ddb, names.control, nodes)
    for q in quotas:
        put_quota(ddb, names.control, q)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--quota-teams", type=int, default=20)
    ap.add_argument("--moto-stock", action="store_true", help="keep moto's whole-table rollback copies")
    args = ap.parse_args(argv)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if not args.moto_stock:
        install_fast_rollback()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        names = TableNames()
        create_tables(ddb, names)
        t0 = time.perf_counter()
        seed(ddb, names, args.jobs, args.nodes, args.quota_teams)
        seed_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        report = run_pass(pass_stores(ddb, names), pools=load_pools({}), clock=FakeClock(NOW + 600))
        total = time.perf_counter() - t1
    out = {
        "jobs": args.jobs,
        "nodes": args.nodes,
        "placed": report.placed,
        "lost": report.lost,
        "pass_s": round(total, 2),
        "snapshot_s": round(report.snapshot_s, 2),
        "cycle_s": round(report.cycle_s, 2),
        "commit_s": round(report.commit_s, 2),
        "commit_ms_per_placement": round(1000 * report.commit_s / max(1, report.placed + report.lost), 2),
        "seed_s": round(seed_s, 2),
        "moto_rollback": "stock" if args.moto_stock else "touched-items",
    }
    print(f"pass over {args.jobs} pending jobs x {args.nodes} nodes on moto: {total:.1f} s "
          f"(snapshot {report.snapshot_s:.1f} s, cycle {report.cycle_s:.1f} s, commits {report.commit_s:.1f} s); "
          f"placed {report.placed}, lost races {report.lost}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
