"""Benchmark: denoising step time with checkpoints every step, asynchronous vs synchronous vs none, in one run.

Everything is real except AWS, which is a moto server on 127.0.0.1 (a separate
process): the tiny Wan model runs the runtime's resumable loop
(gpufleet.runtime.denoise); each checkpoint is the full snapshot (latents,
scheduler state, RNG states, prompt embeddings) serialised with torch.save,
PUT to S3 and followed by the fenced DynamoDB pointer update
(gpufleet.runtime.checkpoint + jobitem), exactly as in the generate stage.

Modes, interleaved round-robin for `--rounds` rounds (default 5), median step time each:
- none:  no checkpoints (baseline)
- async: AsyncCheckpointer (the runtime's default), a checkpoint submitted after
         every step; the compute thread only takes the snapshot (tensor copies),
         serialisation, PUT and pointer update run on the writer thread
- sync:  SyncCheckpointer, the same writes on the compute thread

Also printed: the compute thread's own cost per checkpoint (snapshot) and the
writer's serialisation time, measured in isolation. On a CPU-saturated machine
the writer's work (and the moto server's) competes with the compute for cores,
so the async ratio there measures contention; on a GPU the step waits on the
device and the writer's CPU work overlaps it.

Ratios are step time over the baseline (target for async: <= 1.05). Step time
is the loop's wall time / steps; the async mode's final flush (one upload after
the last step) is reported separately as `async_drain_ms`.

The moto server runs at nice 19 by default (`--moto-nice`): real S3/DynamoDB do not use the
job's CPU, and at nice 0 on a 2-core machine the stand-in's request handling competes with the
compute loop. Read `async_checkpoints_per_run` with the ratio: a slow store means fewer
(coalesced) checkpoints, not a slower loop.

Usage: .venv/bin/python benchmarks/checkpoint_overhead.py [--steps 20] [--rounds 5] [--side 64] [--threads 1] [--moto-nice 19]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import boto3


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_moto(nice: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    # Niced by default: S3 and DynamoDB are remote services; their stand-in should not win CPU from the job.
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(nice))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--moto-nice", type=int, default=19, help="niceness of the moto server (0 = compete equally)")
    args = ap.parse_args()

    import torch

    from gpufleet.models.tiny_wan import build_tiny_wan
    from gpufleet.runtime import denoise
    from gpufleet.runtime.checkpoint import AsyncCheckpointer, CheckpointStore, SyncCheckpointer
    from gpufleet.runtime.jobitem import JobItem
    from gpufleet.runtime.objectstore import ObjectStore
    from gpufleet.store.dynamo import marshal
    from gpufleet.store.schema import create_tables
    from gpufleet.tables import JOB_META, TableNames, job_pk

    torch.set_num_threads(args.threads)
    moto, url = start_moto(args.moto_nice)
    try:
        kw = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench")
        ddb, s3 = boto3.client("dynamodb", **kw), boto3.client("s3", **kw)
        tables = TableNames()
        create_tables(ddb, tables)
        s3.create_bucket(Bucket="bench-checkpoints")
        ddb.put_item(TableName=tables.jobs, Item=marshal({"pk": job_pk("job_bench"), "sk": JOB_META,
                                                          "job_id": "job_bench", "current_epoch": 1}))
        job = JobItem(tables.jobs, "job_bench", 1, client=ddb)
        store = CheckpointStore(ObjectStore(s3), "bench-checkpoints", "jobs/job_bench/", 1,
                                lambda ref: job.set_checkpoint(ref.key, ref.sha256, ref.step))
        pipe = build_tiny_wan()
        req = denoise.GenerationRequest("a red fox running in snow", "", 9, args.side, args.side, args.steps, 0, 5.0, 16)

        def run(mode: str) -> tuple[float, float, int]:
            state = denoise.start(pipe, req, "bench")
            writer = None
            if mode == "async":
                writer = AsyncCheckpointer(store, denoise.serialize)
            elif mode == "sync":
                writer = SyncCheckpointer(store, denoise.serialize)
            t0 = time.perf_counter()
            while state.next_step < req.steps:
                denoise.denoise_step(pipe, req, state)
                if writer is not None:
                    writer.submit(state.next_step, denoise.snapshot(pipe, state))
            loop = time.perf_counter() - t0
            drain = 0.0
            written = 0
            if writer is not None:
                t1 = time.perf_counter()
                writer.close()
                drain = time.perf_counter() - t1
                writer.raise_error()
                written = writer.written
            return loop / req.steps, drain, written

        run("none")  # warm-up (first-call allocations, lazy imports)
        run("async")
        modes = ("none", "async", "sync")
        samples: dict[str, list[float]] = {m: [] for m in modes}
        drains, written = [], {"async": 0, "sync": 0}
        for r in range(args.rounds):
            for mode in modes:
                step, drain, n = run(mode)
                samples[mode].append(step)
                if mode == "async":
                    drains.append(drain)
                if mode in written:
                    written[mode] += n
                print(f"round {r + 1} {mode:12s}: {step * 1000:8.2f} ms/step" + (f"  ({n} checkpoints)" if n else ""))
        med = {m: statistics.median(v) for m, v in samples.items()}
        probe = denoise.start(pipe, req, "bench")
        t0 = time.perf_counter()
        for _ in range(50):
            snap = denoise.snapshot(pipe, probe)
        snapshot_ms = (time.perf_counter() - t0) / 50 * 1000
        t0 = time.perf_counter()
        for _ in range(20):
            blob = len(denoise.serialize(snap))
        serialize_ms = (time.perf_counter() - t0) / 20 * 1000
        print(f"compute-thread cost per checkpoint (snapshot): {snapshot_ms:.3f} ms; writer serialisation "
              f"{serialize_ms:.2f} ms")
        print(f"checkpoint size {blob} bytes; {args.steps} steps of {args.side}x{args.side}x9, torch threads {args.threads}")
        for m in modes:
            print(f"median {m:12s}: {med[m] * 1000:8.2f} ms/step   ratio {med[m] / med['none']:.3f}")
        print(f"async writes per run: {written['async'] / args.rounds:.1f} of {args.steps - 0} submitted "
              "(a newer snapshot replaces one not yet started)")
        print(json.dumps({
            "step_ms_none": round(med["none"] * 1000, 2),
            "step_ms_async": round(med["async"] * 1000, 2),
            "step_ms_sync": round(med["sync"] * 1000, 2),
            "async_ratio": round(med["async"] / med["none"], 3),
            "sync_ratio": round(med["sync"] / med["none"], 3),
            "async_drain_ms": round(statistics.median(drains) * 1000, 2),
            "async_checkpoints_per_run": written["async"] / args.rounds,
            "sync_checkpoints_per_run": written["sync"] / args.rounds,
            "checkpoint_bytes": blob,
            "snapshot_ms": round(snapshot_ms, 3),
            "serialize_ms": round(serialize_ms, 2),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "moto_nice": args.moto_nice,
            "cpus": os.cpu_count(),
        }))
    finally:
        moto.terminate()
        moto.wait(10)


if __name__ == "__main__":
    main()
