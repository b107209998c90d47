"""Benchmark: one whole scheduler pass at 100,000 pending × 10,000 nodes, simulated — the real pass code over
the in-memory stores, plus a DynamoDB request model checked against the DynamoDB adapters' own calls on moto.

    .venv/bin/python benchmarks/scheduler_pass_sim.py [--jobs 100000] [--nodes 10000] [--calibrate-jobs 300]

1. **Calibration** (moto): a small scenario (``--calibrate-jobs`` pending, a tenth as many nodes) is seeded twice, in
   moto's DynamoDB and in the fakes' memory database, and one pass runs over each (``pass_stores`` / the fakes'
   ``memory_pass_stores``). The DynamoDB adapters' requests are counted by operation (botocore's ``before-call``
   events); the model counts the requests the same pass makes over the fakes (:class:`RequestModel`: query pages
   of 1 MB per partition by the items' marshalled size, one BatchGetItem per 100 tenants, one TransactWriteItems
   per group commit, one UpdateItem per recorded reason or backoff, ...). The two counts must be equal operation by
   operation, and the two passes must place the same jobs; otherwise the script fails.
2. **The large pass**: ``--jobs`` pending jobs (mix of 0.25–8 GPUs, 20 teams under quota) and ``--nodes`` 8-GPU
   nodes in memory; one pass over the fakes, timing the snapshot assembly and the cycle (wall and CPU: the real
   code), counting the requests the model says DynamoDB would serve, and turning them into seconds with per-request
   latencies (:data:`LATENCY_S`, assumptions stated below), the PENDING partitions queried ``READ_PARALLELISM`` at
   a time as the reader does, the single-item writes ``WRITE_PARALLELISM`` at a time and the group commits one after
   another, as the pass does. Pass time = the reader's parse of the wire format and the snapshot assembly (measured),
   the cycle (measured), the commits' CPU over the fakes (measured; an upper bound: the fakes deep-copy items) and the
   modelled DynamoDB time. Producing the wire format and the index lookups (DynamoDB's own work) are excluded.

Latency assumptions (DynamoDB in-region, from AWS's published single-digit-millisecond reads and roughly double for
transactions; not measured here: no AWS account): a Query page or BatchGetItem 10 ms plus 1 MB at 100 MB/s; a
TransactWriteItems 25 ms; an UpdateItem, PutItem or DeleteItem 8 ms. The Lambda limit is 900 s.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_pass_moto import NOW, seed_items  # noqa: E402

from gpufleet.clock import FakeClock  # noqa: E402
from gpufleet.pools import load_pools  # noqa: E402
from gpufleet.scheduler.framework import SchedulerConfig  # noqa: E402
from gpufleet.scheduler.passes import WRITE_PARALLELISM, PassStores, run_pass  # noqa: E402
from gpufleet.store.dynamo import marshal, unmarshal  # noqa: E402
from gpufleet.store.fakes.lease import MemoryLease  # noqa: E402
from gpufleet.store.fakes.memory import MemoryDatabase  # noqa: E402
from gpufleet.store.fakes.placements import MemoryPlacementStore  # noqa: E402
from gpufleet.store.fakes.queueview import MemoryQueueViewStore  # noqa: E402
from gpufleet.store.fakes.quotas import MemoryQuotaStore  # noqa: E402
from gpufleet.store.fakes.snapshot import MemorySnapshotReader, _project  # noqa: E402
from gpufleet.store.snapshot import PENDING_PROJECTION, merge_pending  # noqa: E402
from gpufleet.tables import DIRECTORY_ATTR, PENDING_PARTITIONS, TableNames  # noqa: E402

PAGE_BYTES = 1024 * 1024
READ_PARALLELISM = 8  # the snapshot reader's threads over the PENDING partitions
LATENCY_S = {
    "Query": 0.010, "BatchGetItem": 0.010, "TransactWriteItems": 0.025,
    "UpdateItem": 0.008, "PutItem": 0.008, "DeleteItem": 0.008, "GetItem": 0.005,
}
TRANSFER_S_PER_BYTE = 1 / 100e6
LAMBDA_LIMIT_S = 900


class RequestModel:
    """Counts what DynamoDB would serve for a pass over the fakes (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes_read = 0
        #: seconds spent producing the wire format and looking items up (DynamoDB's work: not pass time)
        self.accounting_s = 0.0
        #: seconds spent parsing the wire format back (the reader's work in the Lambda: pass time)
        self.parse_s = 0.0
        #: Query pages of the PENDING partitions, by partition (read side by side)
        self.pending_pages: list[int] = []


class ModelledReader(MemorySnapshotReader):
    """The fakes' reader, with DynamoDB's side modelled: each partition's projected items are marshalled into the
    wire format (request accounting: pages, bytes; not pass time), then parsed back as the DynamoDB reader would
    (``json.loads`` as botocore does, then :func:`unmarshal`) — that parse is pass time, measured."""

    def __init__(self, db: MemoryDatabase, model: RequestModel) -> None:
        super().__init__(db)
        self.model = model

    def _wire(self, items: list[dict]) -> list[dict]:
        t0 = time.perf_counter()
        wire = json.dumps([marshal(it) for it in items], default=str)
        pages = max(1, math.ceil(len(wire) / PAGE_BYTES))
        self.model.calls["Query"] += pages
        self.model.bytes_read += len(wire)
        t1 = time.perf_counter()
        parsed = [unmarshal(raw) for raw in json.loads(wire)]
        t2 = time.perf_counter()
        self.model.accounting_s += t1 - t0
        self.model.parse_s += t2 - t1
        return parsed, pages

    def _pending(self, limit):
        t0 = time.perf_counter()
        with self.db.lock:
            parts = [sorted((_project(it, PENDING_PROJECTION) for it in self.db.table(self.jobs_table).values()
                             if it.get("gsi3pk") == part), key=lambda it: str(it.get("gsi3sk", "")))
                     for part in PENDING_PARTITIONS]
        self.model.accounting_s += time.perf_counter() - t0  # the index lookup is DynamoDB's work
        read = []
        for items in parts:
            parsed, pages = self._wire(items[:limit] if limit is not None else items)
            self.model.pending_pages.append(pages)
            read.append(parsed)
        return merge_pending(read, limit)

    def _control(self):
        t0 = time.perf_counter()
        with self.db.lock:
            items = list(self.db.table(self.control_table).values())
            listed = [[it for it in items if it.get(DIRECTORY_ATTR) == part] for part in self.parts]
        self.model.accounting_s += time.perf_counter() - t0
        return [it for part in listed for it in self._wire(part)[0]]

    def _policies(self, tenants):
        self.model.calls["BatchGetItem"] += math.ceil(len(tenants) / 100)
        return super()._policies(tenants)


class ModelledDatabase(MemoryDatabase):
    model: RequestModel


class ModelledPlacements(MemoryPlacementStore):
    def _try(self, batch, quotas, pools):  # one TransactWriteItems: a group, or one placement after a lost group
        self.db.model.calls["TransactWriteItems"] += 1
        return super()._try(batch, quotas, pools)

    def record_backoff(self, job_id, until, reason):
        self.db.model.calls["UpdateItem"] += 1
        return super().record_backoff(job_id, until, reason)

    def record_reason(self, job_id, reason):
        self.db.model.calls["UpdateItem"] += 1
        return super().record_reason(job_id, reason)

    def request_preemption(self, victim, by_job, now):
        self.db.model.calls["UpdateItem"] += 1
        return super().request_preemption(victim, by_job, now)


class ModelledLease(MemoryLease):
    def acquire(self, owner, now, ttl_s):
        self.db.model.calls["PutItem"] += 1
        return super().acquire(owner, now, ttl_s)

    def release(self, owner):
        self.db.model.calls["DeleteItem"] += 1
        return super().release(owner)


class ModelledQueue(MemoryQueueViewStore):
    def put(self, view):
        self.db.model.calls["PutItem"] += 1
        return super().put(view)


def memory_world(n_jobs: int, n_nodes: int, teams: int = 20) -> tuple[PassStores, RequestModel, MemoryDatabase]:
    model = RequestModel()
    db = ModelledDatabase()
    db.model = model
    jobs, nodes, quotas = seed_items(n_jobs, n_nodes, teams)
    names = TableNames()
    with db.lock:
        for it in jobs:
            db.table(names.jobs)[(it["pk"], it["sk"])] = json.loads(json.dumps(it))
        for it in nodes:
            db.table(names.control)[(it["pk"], it["sk"])] = it
    for q in quotas:
        MemoryQuotaStore(db, names.control).put(q)
    for table in (names.jobs, names.control):  # the fakes' tables are named after the real ones here
        db.tables.setdefault(table, {})
    reader = ModelledReader(db, model)
    reader.jobs_table, reader.control_table = names.jobs, names.control
    stores = PassStores(snapshot=reader, placements=ModelledPlacements(db, names),
                        lease=ModelledLease(db, names.control), queue=ModelledQueue(db, names.control))
    return stores, model, db


def calibrate(n_jobs: int) -> dict:
    """One small pass on moto (requests counted by botocore) and over the fakes (requests modelled)."""
    import boto3
    from moto import mock_aws
    from scheduler_pass_moto import install_fast_rollback, seed

    from gpufleet.store.scheduling import pass_stores
    from gpufleet.store.schema import create_tables

    n_nodes = max(2, n_jobs // 10)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    install_fast_rollback()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        names = TableNames()
        create_tables(ddb, names)
        seed(ddb, names, n_jobs, n_nodes, 20)
        real: Counter[str] = Counter()
        ddb.meta.events.register("before-call.dynamodb.*", lambda model, **_: real.update([model.name]))
        report = run_pass(pass_stores(ddb, names), pools=load_pools({}), clock=FakeClock(NOW + 600))
        placed_real = report.placed
    stores, model, _ = memory_world(n_jobs, n_nodes)
    mreport = run_pass(stores, pools=load_pools({}), clock=FakeClock(NOW + 600))
    agree = dict(real) == dict(model.calls) and placed_real == mreport.placed
    return {"jobs": n_jobs, "nodes": n_nodes, "moto_requests": dict(real), "model_requests": dict(model.calls),
            "placed_moto": placed_real, "placed_model": mreport.placed, "agree": agree}


def modelled_seconds(model: RequestModel) -> dict:
    """DynamoDB time of a pass's requests: PENDING pages READ_PARALLELISM partitions at a time; the rest in turn."""
    transfer = model.bytes_read * TRANSFER_S_PER_BYTE
    pending_pages = sorted(model.pending_pages, reverse=True)
    waves = [pending_pages[i:i + READ_PARALLELISM] for i in range(0, len(pending_pages), READ_PARALLELISM)]
    pending_s = sum(max(w) for w in waves) * LATENCY_S["Query"]
    other_queries = model.calls["Query"] - sum(pending_pages)
    read_s = pending_s + other_queries * LATENCY_S["Query"] + model.calls["BatchGetItem"] * LATENCY_S["BatchGetItem"]
    # the pass's single-item writes (reasons, backoffs, preemption requests) go WRITE_PARALLELISM at a time;
    # its transactions, lease and queue view one after another
    parallel = math.ceil(model.calls["UpdateItem"] / WRITE_PARALLELISM) * LATENCY_S["UpdateItem"]
    write_s = parallel + sum(n * LATENCY_S[op] for op, n in model.calls.items()
                             if op not in ("Query", "BatchGetItem", "UpdateItem"))
    return {"read_s": round(read_s + transfer, 2), "write_s": round(write_s, 2), "transfer_s": round(transfer, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--calibrate-jobs", type=int, default=300)
    ap.add_argument("--max-jobs-per-pass", type=int, default=None,
                    help="the cycle's cap on jobs decided per pass (default: every pending job; deployed default 10,000)")
    args = ap.parse_args(argv)

    cal = calibrate(args.calibrate_jobs)
    print(f"calibration ({cal['jobs']} jobs x {cal['nodes']} nodes): moto {cal['moto_requests']}, "
          f"model {cal['model_requests']}, placed {cal['placed_moto']} / {cal['placed_model']}: "
          f"{'agree' if cal['agree'] else 'DISAGREE'}")
    if not cal["agree"]:
        print(json.dumps({"ok": False, "calibration": cal}))
        return 1

    t0 = time.perf_counter()
    stores, model, _ = memory_world(args.jobs, args.nodes)
    seed_s = time.perf_counter() - t0
    cpu0 = time.process_time()
    t1 = time.perf_counter()
    config = SchedulerConfig(max_jobs_per_pass=args.max_jobs_per_pass or max(1, args.jobs))
    report = run_pass(stores, pools=load_pools({}), clock=FakeClock(NOW + 600), config=config)
    wall = time.perf_counter() - t1 - model.accounting_s
    cpu = time.process_time() - cpu0
    io = modelled_seconds(model)
    snapshot_s = report.snapshot_s - model.accounting_s  # parse + assembly: the reader's own work
    total = snapshot_s + report.cycle_s + io["read_s"] + io["write_s"] + report.commit_s
    out = {
        "jobs": args.jobs, "nodes": args.nodes, "placed": report.placed, "lost": report.lost,
        "max_jobs_per_pass": config.max_jobs_per_pass, "considered": report.considered,
        "snapshot_s": round(snapshot_s, 2), "snapshot_parse_s": round(model.parse_s, 2), "cycle_s": round(report.cycle_s, 2),
        "commit_cpu_s": round(report.commit_s, 2), "pass_wall_s": round(wall, 2), "pass_cpu_s": round(cpu - model.accounting_s, 2),
        "requests": dict(model.calls), "bytes_read": model.bytes_read, **{f"dynamodb_{k}": v for k, v in io.items()},
        "modelled_pass_s": round(total, 1), "lambda_limit_s": LAMBDA_LIMIT_S,
        "under_60s": total < 60, "under_lambda_limit": total < LAMBDA_LIMIT_S,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seed_s": round(seed_s, 1), "load_avg_1m": round(os.getloadavg()[0], 1), "calibration": cal,
    }
    print(f"pass over {args.jobs} pending x {args.nodes} nodes: snapshot (parse + assembly) {snapshot_s:.1f} s, "
          f"cycle {report.cycle_s:.1f} s, commits (memory) {report.commit_s:.1f} s; DynamoDB modelled: reads "
          f"{io['read_s']} s, writes {io['write_s']} s; total {total:.1f} s; placed {report.placed}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
