"""Benchmark: jobs per minute on one warm worker, single jobs vs denoising batches, at equal output.

The same N ``generate`` jobs (the demo's shape: ``wan-tiny``, 9 frames requested at 256², generated at
``--side`` px, ``--steps`` steps, guidance 5; each its own prompt and seed) run through the runtime's real
generate stage (``gpufleet.runtime.main.main``: fenced job-item writes, checkpoints, progress, decode,
output upload, phases) against moto in this process, with the model resident as on a warm worker:

- ``single``: one job after another (what a warm worker does today);
- ``batch``: groups of ``--batch`` jobs, each group one :class:`gpufleet.runtime.batchloop.DenoiseBatch`
  with every member's stage on a thread (what a warm worker does with a batch request,
  :func:`gpufleet.runtime.worker.run_member`).

Equal output: every job's persisted frames must be bitwise the same in both modes (checked; the run exits 1
otherwise, after printing its figures with how many outputs differed and by how much). The process's CPU time per job is reported too (all threads): on a busy machine a batch's threads
can win CPU time from other processes that one job's thread would not, so compare it as well. Rounds alternate (single, batch, single, batch, ...) so load drifts hit both; the figure is
the median of ``--rounds``. Torch runs one thread (``GPUFLEET_TORCH_THREADS=1``, as the agent's CPU slots).

Usage: .venv/bin/python benchmarks/batching.py [--jobs 16] [--batch 4] [--steps 10] [--side 64] [--rounds 3]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
BUCKETS = {"bucket_outputs": "bench-outputs", "bucket_checkpoints": "bench-checkpoints", "bucket_logs": "bench-logs"}
PROMPTS = [
    "a red fox running in snow",
    "a blue bird flying over the sea",
    "a cat sitting near a river",
    "a boat on the ocean at night",
    "a horse walking in a green field",
    "the moon over a white mountain",
    "a small dog jumping in the rain",
    "an old train crossing a bridge",
]


def _spec(i: int, steps: int) -> dict:
    return {
        "workload": {
            "kind": "video.generate",
            "prompt": PROMPTS[i % len(PROMPTS)],
            "width": 256,
            "height": 256,
            "frames": 9,
            "steps": steps,
            "seed": 1000 + i,
            "guidance": 5.0,
        }
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pad-rows", type=int, default=None, help="pad every GPU transformer call to this many rows, "
                    "as a batching warm worker does (default: twice --batch; 0: none)")
    args = ap.parse_args()
    os.environ.update(AWS_ENV)
    os.environ.pop("AWS_ENDPOINT_URL", None)

    import boto3
    import numpy as np
    from moto import mock_aws

    from gpufleet.local import moto_patches
    from gpufleet.runtime import resident, worker
    from gpufleet.runtime.batchloop import DenoiseBatch
    from gpufleet.runtime.control import RunControl
    from gpufleet.runtime.generate import unpack_output
    from gpufleet.runtime.main import main as runtime_main
    from gpufleet.runtime.settings import RuntimeSettings
    from gpufleet.store.dynamo import marshal
    from gpufleet.store.schema import create_tables
    from gpufleet.tables import JOB_META, TableNames, job_pk

    tmp = Path(tempfile.mkdtemp(prefix="bench-batching-"))
    load_before = os.getloadavg()
    resident.RESIDENT = resident.ResidentModels()  # the model stays loaded across runs, as on a warm worker
    from gpufleet.runtime import denoise

    pad_rows = 2 * args.batch if args.pad_rows is None else args.pad_rows
    denoise.set_pad_rows(pad_rows)  # as the worker does with GPUFLEET_BATCH_PAD_ROWS (GPU calls only)
    settings = RuntimeSettings(state_dir=str(tmp / "state"), cache_dir=str(tmp / "cache"), log_flush_s=5,
                               torch_threads=1, tiny_generate_side=args.side)
    tables = TableNames()

    def fresh_aws():
        """A new moto backend per run: moto slows down as objects and items pile up, which would favour
        whichever mode runs first."""
        ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_tables(ddb, tables)
        for b in BUCKETS.values():
            s3.create_bucket(Bucket=b)
        return ddb, s3

    def put_job(ddb, job_id: str, spec: dict) -> list[str]:
        ddb.put_item(TableName=tables.jobs, Item=marshal({"pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id,
                                                          "status": "SCHEDULED", "current_epoch": 1, "spec": spec}))
        env = {"job_id": job_id, "attempt": 1, "epoch": 1, "stage": "generate", "spec": spec,
               "s3": {**BUCKETS, "output_prefix": f"jobs/{job_id}/", "checkpoint_prefix": f"jobs/{job_id}/",
                      "log_prefix": f"jobs/{job_id}/attempt-0001/"}, "tables": {"jobs": tables.jobs}}
        return ["--envelope-json", json.dumps(env)]

    def frames(ddb, s3, job_id: str):
        item = ddb.get_item(TableName=tables.jobs, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}})
        key = item["Item"]["generated"]["M"]["key"]["S"]
        return unpack_output(s3.get_object(Bucket=BUCKETS["bucket_outputs"], Key=key)["Body"].read())[0]

    def run_single(tag: str) -> tuple[float, list]:
        with mock_aws(), moto_patches.patch_dynamodb_serialised():
            ddb, s3 = fresh_aws()
            argvs = [put_job(ddb, f"{tag}-{i}", _spec(i, args.steps)) for i in range(args.jobs)]
            t0, c0 = time.perf_counter(), time.process_time()
            for argv in argvs:
                code = runtime_main(argv, settings=settings, s3=s3, dynamodb=ddb, stdout=io.StringIO(),
                                    install_signals=False)
                assert code == 0, code
            wall = time.perf_counter() - t0
            cpu["single"].append(time.process_time() - c0)
            return wall, [frames(ddb, s3, f"{tag}-{i}") for i in range(args.jobs)]

    gpu_seconds: list[float] = []
    cpu: dict[str, list[float]] = {"single": [], "batch": []}  # this process's CPU seconds (all threads)

    def run_batched(tag: str) -> tuple[float, list]:
        with mock_aws(), moto_patches.patch_dynamodb_serialised():
            ddb, s3 = fresh_aws()
            jobs = [{"id": f"{tag}-{i}", "argv": put_job(ddb, f"{tag}-{i}", _spec(i, args.steps)), "env": {},
                     "log": str(tmp / f"{tag}-{i}.log")} for i in range(args.jobs)]
            replies: list[dict] = []
            t0, c0 = time.perf_counter(), time.process_time()
            for g in range(0, len(jobs), args.batch):
                group = jobs[g:g + args.batch]
                batch = DenoiseBatch(len(group), max_members=args.batch, free_bytes=lambda: None)
                threads = [threading.Thread(target=worker.run_member, args=(job, RunControl(), batch.member(),
                                                                            replies.append),
                                            kwargs={"settings": settings, "s3": s3, "dynamodb": ddb}) for job in group]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            wall = time.perf_counter() - t0
            cpu["batch"].append(time.process_time() - c0)
            assert all(r["exit_code"] == 0 for r in replies), replies
            gpu_seconds.append(sum(r["gpu_seconds"] for r in replies))
            return wall, [frames(ddb, s3, f"{tag}-{i}") for i in range(args.jobs)]

    run_single("warmup")  # the model load and first-call costs, paid once, outside the figures
    single, batched, unequal = [], [], []
    for r in range(args.rounds):
        s_wall, s_frames = run_single(f"s{r}")
        b_wall, b_frames = run_batched(f"b{r}")
        single.append(s_wall)
        batched.append(b_wall)
        for i in range(args.jobs):
            if not np.array_equal(s_frames[i], b_frames[i]):
                diff = np.abs(s_frames[i].astype(np.float64) - b_frames[i].astype(np.float64))
                unequal.append({"round": r, "job": i, "max_abs_diff": float(diff.max()),
                                "mean_abs_diff": float(diff.mean())})
    load_after = os.getloadavg()
    s_wall, b_wall = statistics.median(single), statistics.median(batched)
    result = {
        "benchmark": "batching",
        "jobs": args.jobs,
        "batch": args.batch,
        "steps": args.steps,
        "generated_side": args.side,
        "frames": 9,
        "rounds": args.rounds,
        "single_s": [round(x, 2) for x in single],
        "batch_s": [round(x, 2) for x in batched],
        "single_jobs_per_min": round(args.jobs * 60 / s_wall, 1),
        "batch_jobs_per_min": round(args.jobs * 60 / b_wall, 1),
        "speedup": round(s_wall / b_wall, 2),
        "outputs_bitwise_equal": not unequal,
        "unequal_outputs": len(unequal),
        "compared_outputs": args.jobs * args.rounds,
        "max_abs_diff": max((u["max_abs_diff"] for u in unequal), default=0.0),
        "mean_abs_diff_of_unequal": (round(statistics.mean(u["mean_abs_diff"] for u in unequal), 6) if unequal
                                     else 0.0),
        "frames_dtype": str(s_frames[0].dtype),
        "pad_rows": pad_rows,
        "cpu_s_per_job_single": round(statistics.median(cpu["single"][1:] or cpu["single"]) / args.jobs, 4),
        "cpu_s_per_job_batch": round(statistics.median(cpu["batch"]) / args.jobs, 4),
        "batch_gpu_seconds_billed_per_round": [round(x, 2) for x in gpu_seconds],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    print(
        f"single: {result['single_jobs_per_min']} jobs/min  batch of {args.batch}: "
        f"{result['batch_jobs_per_min']} jobs/min  speedup {result['speedup']}x ("
        + ("outputs bitwise equal)" if not unequal else
           f"{len(unequal)} of {args.jobs * args.rounds} outputs differ, max |diff| {result['max_abs_diff']:.3g})")
    )
    print(json.dumps(result))
    return 0 if not unequal else 1  # batching changed a result: the run fails (its figures are still printed)


if __name__ == "__main__":
    sys.exit(main())
