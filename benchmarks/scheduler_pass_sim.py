"""Benchmark: one whole scheduler pass at 100,000 pending × 10,000 nodes, simulated — the real pass code over
the in-memory stores, as ``--shards`` passes side by side, plus a DynamoDB request model checked against the
DynamoDB adapters' own calls on moto.

    .venv/bin/python benchmarks/scheduler_pass_sim.py [--jobs 100000] [--nodes 10000] [--shards 8] [--lanes 4]
        [--max-jobs-per-pass N] [--passes 1] [--calibrate-jobs 300]

1. **Calibration** (moto): a small scenario (``--calibrate-jobs`` pending, a tenth as many nodes) is seeded twice, in
   moto's DynamoDB and in the fakes' memory database, and the same sharded pass (2 shards × 2 lanes, or fewer) runs
   over each (``pass_stores`` / the fakes with the model). The DynamoDB adapters' requests are counted by operation
   (botocore's ``before-call`` events); the model counts the requests the same passes make over the fakes
   (:class:`RequestModel`: query pages of 1 MB per partition by the items' marshalled size, one BatchGetItem per 100
   tenants, one TransactWriteItems per group commit and per quota reservation / give-back chunk, a GetItem per lane's
   escrow, one UpdateItem per recorded reason or backoff, ...). The counts must be equal operation by operation, and
   every shard must place and lose the same number of jobs on both; otherwise the script fails.
2. **The large pass**: ``--jobs`` pending jobs (mix of 0.25–8 GPUs, 20 teams under quota) and ``--nodes`` 8-GPU
   nodes in memory. As concurrent shards would, every shard first reads its snapshot (its PENDING partitions, its
   nodes), then each runs its cycle and commits over what it read (here one after another; the later shards' quota
   reservations meet what the earlier ones took, as they would meet it concurrently). Per shard: the reader's parse
   of the wire format and the snapshot assembly, the cycle, the commits' CPU over the fakes (an upper bound: the fakes
   deep-copy items) — measured in wall time and in CPU time —, plus the modelled DynamoDB time of its own requests
   (:data:`LATENCY_S`): its PENDING partitions queried ``READ_PARALLELISM`` at a time, the directory and tenant reads
   in turn, its lanes' escrow reads in turn, each lane's transactions one after another and the lanes side by side,
   the single-item writes ``WRITE_PARALLELISM`` at a time. The pass takes as long as its slowest shard. Producing the
   wire format and the index lookups (DynamoDB's own work) are excluded.

Latency assumptions (DynamoDB in-region, from AWS's published single-digit-millisecond reads and roughly double for
transactions; not measured here: no AWS account): a Query page or BatchGetItem 10 ms plus 1 MB at 100 MB/s; a
TransactWriteItems 25 ms; an UpdateItem, PutItem or DeleteItem 8 ms; a GetItem 5 ms. The Lambda limit is 900 s (the
function's timeout is 300 s). Transactions across lanes and shards touch different items (their own nodes' bookings,
their own escrow items) except quota reservations on shared quota items and cloud pool counters; the model counts no
``TransactionConflict`` retries for those (a few per lane per pass at most). The last line is one JSON object.
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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_pass_moto import NOW, seed_items  # noqa: E402

from gpufleet.clock import FakeClock  # noqa: E402
from gpufleet.pools import load_pools  # noqa: E402
from gpufleet.scheduler.framework import SchedulerConfig  # noqa: E402
from gpufleet.scheduler.passes import WRITE_PARALLELISM, PassStores, run_pass  # noqa: E402
from gpufleet.scheduler.shards import PassShard  # noqa: E402
from gpufleet.store.dynamo import marshal, unmarshal  # noqa: E402
from gpufleet.store.escrow import chunks as escrow_chunks  # noqa: E402
from gpufleet.store.escrow import limit_of  # noqa: E402
from gpufleet.store.fakes.lease import MemoryLease  # noqa: E402
from gpufleet.store.fakes.memory import MemoryDatabase  # noqa: E402
from gpufleet.store.fakes.placements import MemoryPlacementStore  # noqa: E402
from gpufleet.store.fakes.queueview import MemoryQueueViewStore  # noqa: E402
from gpufleet.store.fakes.quotas import MemoryQuotaStore  # noqa: E402
from gpufleet.store.fakes.snapshot import MemorySnapshotReader, project  # noqa: E402
from gpufleet.store.snapshot import PENDING_PROJECTION, merge_pending  # noqa: E402
from gpufleet.tables import DIRECTORY_ATTR, PENDING_PARTITIONS, QUEUE_VIEW_SK, TableNames  # noqa: E402

PAGE_BYTES = 1024 * 1024
READ_PARALLELISM = 8  # the snapshot reader's threads over the PENDING partitions
LATENCY_S = {
    "Query": 0.010, "BatchGetItem": 0.010, "TransactWriteItems": 0.025,
    "UpdateItem": 0.008, "PutItem": 0.008, "DeleteItem": 0.008, "GetItem": 0.005,
}
TRANSFER_S_PER_BYTE = 1 / 100e6
LAMBDA_LIMIT_S = 900


class RequestModel:
    """Counts what DynamoDB would serve for one shard's pass over the fakes (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes_read = 0
        #: seconds spent producing the wire format and looking items up (DynamoDB's work: not pass time), wall and CPU
        self.accounting_s = 0.0
        self.accounting_cpu_s = 0.0
        #: seconds spent parsing the wire format back (the reader's work in the Lambda: pass time)
        self.parse_s = 0.0
        #: Query pages of the PENDING partitions, by partition (read side by side)
        self.pending_pages: list[int] = []
        #: transactions by commit lane (a lane's transactions go one after another; lanes side by side)
        self.lane_tx: Counter[str] = Counter()
        #: GetItems made before the snapshot, one after another (the lanes' escrow, read by ``recover``)
        self.serial_gets = 0
        #: transactions on the shared quota items (reservations, give-backs): the only ones that contend across lanes
        self.quota_tx = 0


class ModelledReader(MemorySnapshotReader):
    """The fakes' reader, with DynamoDB's side modelled: each partition's projected items are marshalled into the
    wire format (request accounting: pages, bytes; not pass time), then parsed back as the DynamoDB reader would
    (``json.loads`` as botocore does, then :func:`unmarshal`) — that parse is pass time, measured."""

    def __init__(self, db: MemoryDatabase, model: RequestModel, names: TableNames) -> None:
        super().__init__(db, jobs_table=names.jobs, control_table=names.control)
        self.model = model

    def _wire(self, items: list[dict]) -> tuple[list[dict], int]:
        t0, c0 = time.perf_counter(), time.process_time()
        wire = json.dumps([marshal(it) for it in items], default=str)
        pages = max(1, math.ceil(len(wire) / PAGE_BYTES))
        self.model.calls["Query"] += pages
        self.model.bytes_read += len(wire)
        self.model.accounting_cpu_s += time.process_time() - c0
        t1 = time.perf_counter()
        parsed = [unmarshal(raw) for raw in json.loads(wire)]
        t2 = time.perf_counter()
        self.model.accounting_s += t1 - t0
        self.model.parse_s += t2 - t1
        return parsed, pages

    def pending(self, limit, partitions=PENDING_PARTITIONS):
        if limit == 0:
            return []
        t0, c0 = time.perf_counter(), time.process_time()
        with self.db.lock:
            parts = [sorted((project(it, PENDING_PROJECTION) for it in self.db.table(self.jobs_table).values()
                             if it.get("gsi3pk") == part), key=lambda it: str(it.get("gsi3sk", "")))
                     for part in partitions]
        self.model.accounting_s += time.perf_counter() - t0  # the index lookup is DynamoDB's work
        self.model.accounting_cpu_s += time.process_time() - c0
        read = []
        for items in parts:
            parsed, pages = self._wire(items[:limit] if limit is not None else items)
            self.model.pending_pages.append(pages)
            read.append(parsed)
        return merge_pending(read, limit)

    def _control(self):
        t0, c0 = time.perf_counter(), time.process_time()
        with self.db.lock:
            items = list(self.db.table(self.control_table).values())
            listed = [[it for it in items if it.get(DIRECTORY_ATTR) == part] for part in self.parts]
        self.model.accounting_s += time.perf_counter() - t0
        self.model.accounting_cpu_s += time.process_time() - c0
        return [it for part in listed for it in self._wire(part)[0]]

    def _policies(self, tenants):
        self.model.calls["BatchGetItem"] += math.ceil(len(tenants) / 100)
        return super()._policies(tenants)


class ModelledPlacements(MemoryPlacementStore):
    """The fakes' placement store counting the requests the DynamoDB store makes for the same calls: one
    TransactWriteItems per group (or per placement after a lost group), per reserve / give-back chunk of
    ``escrow.chunks`` and, when a level is short, per path (plus a GetItem of a short level and a transaction
    for what is left) — :mod:`gpufleet.store.escrow`."""

    def __init__(self, db: MemoryDatabase, names: TableNames, model: RequestModel) -> None:
        super().__init__(db, names)
        self.model = model

    def _tx(self, lane: str | None, n: int = 1) -> None:
        self.model.calls["TransactWriteItems"] += n
        self.model.lane_tx[lane or "-"] += n

    def _try(self, batch, quotas, pools, lane=None):
        self._tx(lane)
        return super()._try(batch, quotas, pools, lane)

    def escrow(self, lane):
        self.model.calls["GetItem"] += 1
        self.model.serial_gets += 1
        return super().escrow(lane)

    def reserve(self, lane, needs, quotas):
        granted = super().reserve(lane, needs, quotas)
        wanted = {p: {t: n for t, n in pt.items() if n > 0} for p, pt in needs.items()}
        wanted = {p: pt for p, pt in wanted.items() if pt}
        for chunk in escrow_chunks(wanted):
            self._tx(lane)
            self.model.quota_tx += 1
            if all(granted.get(p) == wanted[p] for p in chunk):
                continue
            # a level short: the chunk's limited levels read, what is left reserved in one transaction (here nothing
            # moves in between, so the one-path-at-a-time fallback of a concurrent change never happens)
            limited = [p for p in chunk if any(limit_of(quotas, p, t) is not None for t in chunk[p])]
            self.model.calls["GetItem"] += len(limited)
            self.model.lane_tx[lane] += 0.2 * len(limited)  # a GetItem's 5 ms in the lane's time, in transactions
            if any(granted.get(p) for p in chunk):
                self._tx(lane)
                self.model.quota_tx += 1
        return granted

    def give_back(self, lane, amounts):
        back = {p: {t: n for t, n in pt.items() if n > 0} for p, pt in amounts.items()}
        n = len(escrow_chunks({p: pt for p, pt in back.items() if pt}))
        self._tx(lane, n)
        self.model.quota_tx += n
        return super().give_back(lane, amounts)

    def record_backoff(self, job_id, until, reason, shape=""):
        self.model.calls["UpdateItem"] += 1
        return super().record_backoff(job_id, until, reason, shape)

    def record_reason(self, job_id, reason):
        self.model.calls["UpdateItem"] += 1
        return super().record_reason(job_id, reason)

    def request_preemption(self, victim, by_job, now):
        self.model.calls["UpdateItem"] += 1
        return super().request_preemption(victim, by_job, now)


class ModelledLease(MemoryLease):
    model: RequestModel

    def acquire(self, owner, now, ttl_s):
        self.model.calls["PutItem"] += 1
        return super().acquire(owner, now, ttl_s)

    def release(self, owner):
        self.model.calls["DeleteItem"] += 1
        return super().release(owner)


class ModelledQueue(MemoryQueueViewStore):
    model: RequestModel

    def put(self, view):
        self.model.calls["PutItem"] += 1
        return super().put(view)


class Taken:
    """A snapshot reader that hands out the snapshot a shard read before any shard committed (concurrent shards)."""

    def __init__(self, snap) -> None:
        self.snap = snap

    def load(self, pools, now, *, limit=None, shard=None):
        return self.snap


def memory_db(n_jobs: int, n_nodes: int, teams: int = 20) -> MemoryDatabase:
    db = MemoryDatabase()
    jobs, nodes, quotas = seed_items(n_jobs, n_nodes, teams)
    names = TableNames()
    with db.lock:
        for it in jobs:
            db.table(names.jobs)[(it["pk"], it["sk"])] = json.loads(json.dumps(it))
        for it in nodes:
            db.table(names.control)[(it["pk"], it["sk"])] = it
    for q in quotas:
        MemoryQuotaStore(db, names.control).put(q)
    return db


def shard_stores(db: MemoryDatabase, shard: PassShard) -> tuple[PassStores, RequestModel]:
    model = RequestModel()
    names = TableNames()
    lease = ModelledLease(db, names.control, shard.lease_pk)
    lease.model = model
    queue = ModelledQueue(db, names.control, QUEUE_VIEW_SK if shard.whole else f"{QUEUE_VIEW_SK}#{shard.index}of{shard.count}")
    queue.model = model
    return PassStores(snapshot=ModelledReader(db, model, names), placements=ModelledPlacements(db, names, model),
                      lease=lease, queue=queue), model


def sharded_pass(stores_of, shards: list[PassShard], clock_now: float, *, lanes: int, config=None,
                 on_snapshot=None) -> list[dict]:
    """One pass per shard as concurrent shards run them: every shard reads its snapshot first (timed), then each runs
    its cycle and commits over what it read (one after another here; their time is modelled as side by side)."""
    taken = []
    for shard in shards:
        stores = stores_of(shard)
        t0, c0 = time.perf_counter(), time.process_time()
        snap = stores.snapshot.load(load_pools({}), clock_now, shard=shard)
        taken.append((shard, stores, snap, time.perf_counter() - t0, time.process_time() - c0))
        if on_snapshot:
            on_snapshot(shard)
    out = []
    for shard, stores, snap, snap_s, snap_cpu_s in taken:
        cpu0 = time.process_time()
        report = run_pass(replace(stores, snapshot=Taken(snap)), pools=load_pools({}), clock=FakeClock(clock_now),
                          config=config, shard=shard, lanes=lanes, lane_parallelism=1)
        out.append({"shard": shard, "report": report, "snapshot_wall_s": snap_s, "snapshot_cpu_s": snap_cpu_s,
                    "run_cpu_s": time.process_time() - cpu0})
    return out


def calibrate(n_jobs: int, shards: int, lanes: int) -> dict:
    """One small sharded pass on moto (requests counted by botocore) and over the fakes (requests modelled)."""
    import boto3
    from moto import mock_aws
    from scheduler_pass_moto import install_fast_rollback, seed

    from gpufleet.store.scheduling import pass_stores
    from gpufleet.store.schema import create_tables

    n_nodes = max(2, n_jobs // 10)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    install_fast_rollback()
    plan = [PassShard.at(i, shards, NOW + 600) for i in range(shards)]
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        names = TableNames()
        create_tables(ddb, names)
        seed(ddb, names, n_jobs, n_nodes, 20)
        real: Counter[str] = Counter()
        ddb.meta.events.register("before-call.dynamodb.*", lambda model, **_: real.update([model.name]))
        runs = sharded_pass(lambda s: pass_stores(ddb, names, shard=s), plan, NOW + 600, lanes=lanes)
        placed_real = sorted((r["shard"].index, r["report"].placed, r["report"].lost) for r in runs)
    db = memory_db(n_jobs, n_nodes)
    models: list[RequestModel] = []

    def stores_of(shard):
        stores, model = shard_stores(db, shard)
        models.append(model)
        return stores

    mruns = sharded_pass(stores_of, plan, NOW + 600, lanes=lanes)
    modelled: Counter[str] = Counter()
    for m in models:
        modelled.update(m.calls)
    placed_model = sorted((r["shard"].index, r["report"].placed, r["report"].lost) for r in mruns)
    agree = dict(real) == dict(modelled) and placed_real == placed_model
    return {"jobs": n_jobs, "nodes": n_nodes, "shards": shards, "lanes": lanes, "moto_requests": dict(real),
            "model_requests": dict(modelled), "placed_lost_by_shard_moto": placed_real,
            "placed_lost_by_shard_model": placed_model, "agree": agree}


def modelled_seconds(model: RequestModel, lanes_parallel: bool = True) -> dict:
    """DynamoDB time of one shard's requests: PENDING pages READ_PARALLELISM partitions at a time, the directory
    queries and tenant reads in turn; the lanes' escrow reads in turn; each lane's transactions in turn and the lanes
    side by side; the single-item writes WRITE_PARALLELISM at a time; the lease and queue view in turn."""
    transfer = model.bytes_read * TRANSFER_S_PER_BYTE
    pending_pages = sorted(model.pending_pages, reverse=True)
    waves = [pending_pages[i:i + READ_PARALLELISM] for i in range(0, len(pending_pages), READ_PARALLELISM)]
    pending_s = sum(max(w) for w in waves) * LATENCY_S["Query"]
    other_queries = model.calls["Query"] - sum(pending_pages)
    read_s = pending_s + other_queries * LATENCY_S["Query"] + model.calls["BatchGetItem"] * LATENCY_S["BatchGetItem"]
    lanes = list(model.lane_tx.values()) or [0]
    tx_s = (max(lanes) if lanes_parallel else sum(lanes)) * LATENCY_S["TransactWriteItems"]
    parallel = math.ceil(model.calls["UpdateItem"] / WRITE_PARALLELISM) * LATENCY_S["UpdateItem"]
    write_s = (tx_s + parallel + model.serial_gets * LATENCY_S["GetItem"]
               + sum(model.calls[op] * LATENCY_S[op] for op in ("PutItem", "DeleteItem")))
    return {"read_s": round(read_s + transfer, 2), "write_s": round(write_s, 2), "transfer_s": round(transfer, 2),
            "transactions_s": round(tx_s, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--shards", type=int, default=8, help="passes side by side (the deployment's scheduler_shards)")
    ap.add_argument("--lanes", type=int, default=4, help="commit lanes per pass")
    ap.add_argument("--calibrate-jobs", type=int, default=300)
    ap.add_argument("--max-jobs-per-pass", type=int, default=None,
                    help="the cycle's cap on jobs decided per shard's pass (default: every pending job)")
    ap.add_argument("--passes", type=int, default=1,
                    help="passes in a row, a minute apart (the later ones write only the wait reasons that changed)")
    args = ap.parse_args(argv)

    cal = calibrate(args.calibrate_jobs, min(args.shards, 2), min(args.lanes, 2))
    print(f"calibration ({cal['jobs']} jobs x {cal['nodes']} nodes, {cal['shards']} shards x {cal['lanes']} lanes): "
          f"moto {cal['moto_requests']}, model {cal['model_requests']}, placed/lost by shard "
          f"{cal['placed_lost_by_shard_moto']} / {cal['placed_lost_by_shard_model']}: "
          f"{'agree' if cal['agree'] else 'DISAGREE'}")
    if not cal["agree"]:
        print(json.dumps({"ok": False, "calibration": cal}))
        return 1

    t0 = time.perf_counter()
    db = memory_db(args.jobs, args.nodes)
    seed_s = time.perf_counter() - t0
    config = SchedulerConfig(max_jobs_per_pass=args.max_jobs_per_pass or max(1, args.jobs))
    passes = []
    for n in range(args.passes):
        now = NOW + 600 + 60 * n
        plan = [PassShard.at(i, args.shards, now) for i in range(args.shards)]
        models: dict[int, RequestModel] = {}

        def stores_of(shard, models=models):
            stores, model = shard_stores(db, shard)
            models[shard.index] = model
            return stores

        runs = sharded_pass(stores_of, plan, now, lanes=args.lanes, config=config)
        rows = []
        for r in runs:
            model, report = models[r["shard"].index], r["report"]
            io = modelled_seconds(model)
            snapshot_s = r["snapshot_wall_s"] - model.accounting_s  # parse + assembly: the reader's own work
            total = snapshot_s + report.cycle_s + report.commit_s + io["read_s"] + io["write_s"]
            # the same with CPU time instead of wall time for the code's own work (steady on a loaded machine)
            cpu_s = r["snapshot_cpu_s"] - model.accounting_cpu_s + r["run_cpu_s"]
            total_cpu = cpu_s + io["read_s"] + io["write_s"]
            rows.append({"shard": r["shard"].index, "pending": report.pending, "placed": report.placed,
                         "lost": report.lost, "snapshot_s": round(snapshot_s, 2), "cycle_s": round(report.cycle_s, 2),
                         "commit_cpu_s": round(report.commit_s, 2), "run_cpu_s": round(r["run_cpu_s"], 2),
                         "requests": dict(model.calls), **{f"dynamodb_{k}": v for k, v in io.items()},
                         "quota_transactions": model.quota_tx,
                         "code_cpu_s": round(cpu_s, 2), "modelled_s": round(total, 1),
                         "modelled_cpu_s": round(total_cpu, 1)})
        slowest = max(rows, key=lambda x: x["modelled_s"])
        passes.append({"pass": n + 1, "shards": rows, "placed": sum(x["placed"] for x in rows),
                       "lost": sum(x["lost"] for x in rows),
                       "reasons_written": sum(x["requests"].get("UpdateItem", 0) for x in rows),
                       "modelled_pass_s": slowest["modelled_s"], "slowest_shard": slowest["shard"],
                       "modelled_pass_cpu_s": max(x["modelled_cpu_s"] for x in rows),
                       # not in the figures above: TransactionConflict retries on shared quota items. A bound: every
                       # shard's reservations and give-backs one after another
                       "quota_transactions_serial_s": round(sum(x["quota_transactions"] for x in rows)
                                                            * LATENCY_S["TransactWriteItems"], 2),
                       "load_avg_1m": round(os.getloadavg()[0], 1)})
        for x in rows:
            print(f"  pass {n + 1} shard {x['shard']}: {x['pending']} pending, placed {x['placed']} (lost {x['lost']}); "
                  f"snapshot {x['snapshot_s']} s, cycle {x['cycle_s']} s, commits (memory) {x['commit_cpu_s']} s; "
                  f"DynamoDB reads {x['dynamodb_read_s']} s, writes {x['dynamodb_write_s']} s "
                  f"(transactions {x['dynamodb_transactions_s']} s); shard {x['modelled_s']} s "
                  f"(with CPU time: {x['modelled_cpu_s']} s)")
        print(f"pass {n + 1}: {args.shards} shards side by side over {args.jobs} pending x {args.nodes} nodes: "
              f"placed {passes[-1]['placed']}, lost {passes[-1]['lost']}, wait reasons written "
              f"{passes[-1]['reasons_written']}; modelled pass (the slowest shard) {passes[-1]['modelled_pass_s']} s "
              f"(with CPU time: {passes[-1]['modelled_pass_cpu_s']} s)")
    first = passes[0]
    out = {
        "jobs": args.jobs, "nodes": args.nodes, "shards": args.shards, "lanes": args.lanes,
        "max_jobs_per_pass": config.max_jobs_per_pass, "placed": first["placed"], "lost": first["lost"],
        "modelled_pass_s": first["modelled_pass_s"], "modelled_pass_cpu_s": first["modelled_pass_cpu_s"],
        "lambda_limit_s": LAMBDA_LIMIT_S,
        "under_60s": first["modelled_pass_s"] < 60, "under_lambda_limit": first["modelled_pass_s"] < LAMBDA_LIMIT_S,
        "passes": passes, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seed_s": round(seed_s, 1), "load_avg_1m": round(os.getloadavg()[0], 1), "calibration": cal,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
