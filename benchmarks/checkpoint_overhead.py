"""Benchmark: denoising step time with a checkpoint submitted after every step, in one run.

Everything is real except AWS, which is a moto server on 127.0.0.1 (a separate
process): the tiny Wan model runs the runtime's resumable loop
(gpufleet.runtime.denoise); each checkpoint is the full snapshot (latents,
scheduler state, RNG states, prompt embeddings) serialised with
denoise.serialize (the safetensors layout of gpufleet.runtime.snapcodec), PUT to
S3 and followed by the fenced DynamoDB pointer update (CheckpointStore + JobItem),
exactly as in the generate stage.

Design (ABA): the box's own drift (other tenants, frequency) moves step time by
±10 % over seconds, more than the effect measured, so every measured run is
bracketed by two baseline runs: each round runs none, m1, none, m2, none, ...
with the modes in a shuffled order (seeded), and a mode's ratio for that round
is its step time over the mean of the two `none` runs around it. Reported: the
median of those per-round ratios over `--rounds` rounds (default 15) and their
interquartile range. `none-again` is an A/A control, a baseline run measured
like a mode: its ratio shows the resolution of this box (how far from 1.000 a
mode that costs nothing lands).

Modes:
- none:    no checkpoints (baseline)
- none-again: no checkpoints, measured as a mode (the A/A control)
- process: ProcessCheckpointer (gpufleet.runtime.ckptproc): the compute thread
           takes the snapshot and serialises it (tens of µs); a sender thread
           pipes the bytes to a writer process (niced by `--writer-nice`, default
           10) that hashes, PUTs and moves the pointer with its own boto3 clients.
           Paced by UploadPacer (gpufleet.runtime.ckptpace) with the runtime's
           default overhead budget (`--budget`, 0.05): uploads are spaced so that
           what they cost the loop, measured on the loop, stays within it.
- process-unpaced: the same writer without a pacer (every snapshot that
           finds the writer idle is uploaded), i.e. the cost of uploading as
           often as the I/O allows.
- thread:  AsyncCheckpointer: serialisation, PUT and pointer update on a writer
           thread of the compute process (shares its GIL), paced like `process`.
- sync:    SyncCheckpointer, the same writes on the compute thread

Every async run writes under its own S3 prefix; after it the benchmark lists
that prefix and checks that the objects there are exactly the checkpoints the
writer reported written, and that the job's pointer names the newest. It
reports, per mode, snapshots taken / uploaded / coalesced (a newer snapshot
replaced one that had not started) and the largest gap in steps between
consecutive uploads (the recovery point lags the loop by at most that many
steps while it runs). The writer process starts before the timed loop
(start-up reported separately); the final drain after the last step is
reported as `*_drain_ms`, not in the step time. Also printed per mode: the
compute thread's own CPU time per step and how often per step it was preempted
(involuntary context switches): a step that takes longer in wall time but not
in CPU time waited for a core or for the GIL.

`--threads` sets torch's intra-op threads for every mode alike. On the 2-core
dev box `--threads 2` gives the compute all cores (the writer and the moto
server then take CPU from it); `--threads 1` reserves one core for I/O, which
emulates a GPU host where the step runs on the device and host cores are
mostly idle. The moto server runs at `--moto-nice` (default 0: competing
equally; real S3 and DynamoDB use none of the job's CPU).

`--every N` submits after every N-th step instead (the runtime's default cadence is 4).
`--steps` defaults to 50, the Wan pipeline's default number of inference steps.

Usage: .venv/bin/python benchmarks/checkpoint_overhead.py [--steps 50] [--rounds 15] [--side 64]
       [--threads 1] [--moto-nice 0] [--writer-nice 10] [--every 1] [--budget 0.05] [--seed 1]
A checkpoint is requested after every step (or every `--every` steps); as in the
generate stage, a requested checkpoint is taken (snapshot, serialise, submit)
only once the writer `accepts()` it, and otherwise stays requested, so snapshots
are taken only when they will be uploaded. `requested_per_run` in the JSON line
counts requests.

The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
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


def _gaps(steps: list[int], total: int) -> int:
    """Largest number of steps the newest upload lagged the loop (the last step is covered by the drain)."""
    marks = [0, *sorted(steps), total]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1, help="seed of the per-round shuffle of the modes")
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--moto-nice", type=int, default=0, help="niceness of the moto server (0 = compete equally)")
    ap.add_argument("--writer-nice", type=int, default=10, help="niceness added to the writer process")
    ap.add_argument("--every", type=int, default=1, help="submit a checkpoint every N steps (1 = every step)")
    ap.add_argument("--device", default="auto", help="torch device: auto (cuda when visible), cpu, cuda, cuda:N")
    ap.add_argument("--budget", type=float, default=None,
                    help="overhead budget of the paced modes (default: the runtime's setting, 0.05)")
    args = ap.parse_args()

    import torch

    from gpufleet.clock import SystemClock
    from gpufleet.models.tiny_wan import build_tiny_wan
    from gpufleet.runtime import denoise
    from gpufleet.runtime.checkpoint import AsyncCheckpointer, CheckpointStore, SyncCheckpointer
    from gpufleet.runtime.ckptpace import UploadPacer
    from gpufleet.runtime.ckptproc import CheckpointTarget, ProcessCheckpointer
    from gpufleet.runtime.device import torch_device
    from gpufleet.runtime.settings import RuntimeSettings
    from gpufleet.store.dynamo import marshal, unmarshal
    from gpufleet.store.jobitem import JobItem
    from gpufleet.store.objectstore import ObjectStore
    from gpufleet.store.schema import create_tables
    from gpufleet.tables import JOB_META, TableNames, job_pk

    torch.set_num_threads(args.threads)
    defaults = RuntimeSettings()
    budget = defaults.checkpoint_overhead_budget if args.budget is None else args.budget
    load_before = os.getloadavg()[0]
    moto, url = start_moto(args.moto_nice)
    try:
        creds = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                 "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(creds)  # the writer process builds its clients from the environment, as in the runtime
        kw = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench")
        ddb, s3 = boto3.client("dynamodb", **kw), boto3.client("s3", **kw)
        tables = TableNames()
        create_tables(ddb, tables)
        bucket = "bench-checkpoints"
        s3.create_bucket(Bucket=bucket)
        ddb.put_item(TableName=tables.jobs, Item=marshal({"pk": job_pk("job_bench"), "sk": JOB_META,
                                                          "job_id": "job_bench", "current_epoch": 1}))
        job = JobItem(tables.jobs, "job_bench", 1, client=ddb, clock=SystemClock())
        device = torch_device(args.device)
        pipe = build_tiny_wan()
        if device != "cpu":
            pipe.to(device)

        def sync() -> None:  # kernels still queued on the device belong to the loop's time
            if device != "cpu":
                torch.cuda.synchronize()
        req = denoise.GenerationRequest("a red fox running in snow", "", 9, args.side, args.side, args.steps, 0, 5.0, 16)
        runs = [0]

        def set_pointer(ref) -> None:
            job.set_checkpoint(ref.key, ref.sha256, ref.step)

        def pointer() -> dict:
            got = ddb.get_item(TableName=tables.jobs, Key={"pk": {"S": job_pk("job_bench")}, "sk": {"S": JOB_META}},
                               ConsistentRead=True)
            return unmarshal(got["Item"]).get("checkpoint") or {}

        def run(mode: str) -> dict:
            runs[0] += 1
            prefix = f"jobs/job_bench/run-{runs[0]:03d}/"
            state = denoise.start(pipe, req, "bench")
            writer, start_ms = None, 0.0
            pacer = UploadPacer(budget, defaults.checkpoint_max_lag_seconds) if mode in ("process", "thread") else None
            t = time.perf_counter()
            if mode.startswith("process"):
                writer = ProcessCheckpointer(CheckpointTarget(bucket, prefix, 1, tables.jobs, "job_bench"),
                                             denoise.serialize, nice=args.writer_nice, pacer=pacer)
                writer.ready.wait(60)
                start_ms = (time.perf_counter() - t) * 1000
            elif mode == "thread":
                writer = AsyncCheckpointer(CheckpointStore(ObjectStore(s3), bucket, prefix, 1, set_pointer),
                                           denoise.serialize, pacer=pacer)
            elif mode == "sync":
                writer = SyncCheckpointer(CheckpointStore(ObjectStore(s3), bucket, prefix, 1, set_pointer),
                                          denoise.serialize)
            submitted = newest = 0
            ru0, c0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
            sync()
            t0 = time.perf_counter()
            due = False
            while state.next_step < req.steps:
                denoise.denoise_step(pipe, req, state)
                if writer is None:
                    continue
                writer.tick()
                # as the generate stage does: a due checkpoint is taken once the writer accepts it, else stays due
                due = due or state.next_step % args.every == 0
                if due and writer.accepts():
                    writer.submit(state.next_step, denoise.snapshot(pipe, state))
                    submitted, newest, due = submitted + 1, state.next_step, False
            sync()
            loop = time.perf_counter() - t0
            cpu, ru1 = time.thread_time() - c0, resource.getrusage(resource.RUSAGE_THREAD)
            out = {"step": loop / req.steps, "drain": 0.0, "start_ms": start_ms, "submitted": submitted,
                   "written": 0, "gap": 0, "cpu": cpu / req.steps,
                   "preempted": (ru1.ru_nivcsw - ru0.ru_nivcsw) / req.steps,
                   "charged": pacer.charged / loop if pacer else 0.0, "forced": pacer.forced if pacer else 0}
            if writer is None:
                return out
            t1 = time.perf_counter()
            writer.flush()  # the newest snapshot reaches S3 (the writer process's exit is not counted)
            out["drain"] = time.perf_counter() - t1
            writer.close()
            writer.raise_error()
            keys = [k for k, _ in ObjectStore(s3).list_keys(bucket, f"{prefix}checkpoints/")]
            steps = [int(k.rsplit("/", 1)[1][:6]) for k in keys]
            if len(keys) != writer.written or pointer().get("key") != writer.last.key or max(steps) != newest:
                raise RuntimeError(f"{mode}: S3 holds {len(keys)} checkpoints, writer reported {writer.written}; "
                                   f"pointer {pointer()} vs {writer.last}")
            out["written"] = writer.written
            out["gap"] = _gaps(steps[:-1], req.steps) if len(steps) > 1 else req.steps
            return out

        run("none")  # warm-up (first-call allocations, lazy imports)
        run("thread")
        run("process")
        modes = ("none", "none-again", "process", "process-unpaced", "thread", "sync")
        res: dict[str, list[dict]] = {m: [] for m in modes}
        ratios: dict[str, list[float]] = {m: [] for m in modes[1:]}
        shuffle = random.Random(args.seed)

        def measure(r: int, mode: str) -> dict:
            o = run("none" if mode == "none-again" else mode)
            res[mode].append(o)
            extra = f"  ({o['written']}/{o['submitted']} uploaded, max gap {o['gap']})" if o["submitted"] else ""
            if mode in ("process", "thread"):
                extra += f"  pacer charged {o['charged'] * 100:.1f}% of loop time, {o['forced']} forced"
            print(f"round {r + 1} {mode:15s}: {o['step'] * 1000:8.2f} ms/step (compute thread CPU "
                  f"{o['cpu'] * 1000:6.2f} ms/step){extra}", flush=True)
            return o

        for r in range(args.rounds):
            order = list(modes[1:])
            shuffle.shuffle(order)
            before = measure(r, "none")
            for mode in order:
                o = measure(r, mode)
                after = measure(r, "none")
                ratios[mode].append(o["step"] / ((before["step"] + after["step"]) / 2))
                before = after
        load_after = os.getloadavg()[0]

        def med(mode: str, field: str) -> float:
            return statistics.median(o[field] for o in res[mode])

        def iqr(mode: str) -> tuple[float, float]:
            q = statistics.quantiles(ratios[mode], n=4) if len(ratios[mode]) > 1 else ratios[mode] * 3
            return q[0], q[2]

        base = med("none", "step")
        probe = denoise.start(pipe, req, "bench")
        denoise.denoise_step(pipe, req, probe)
        t0 = time.perf_counter()
        for _ in range(200):
            snap = denoise.snapshot(pipe, probe)
        snapshot_ms = (time.perf_counter() - t0) / 200 * 1000
        t0 = time.perf_counter()
        for _ in range(200):
            blob = len(denoise.serialize(snap))
        serialize_ms = (time.perf_counter() - t0) / 200 * 1000
        print(f"compute-thread cost per checkpoint: snapshot {snapshot_ms:.3f} ms + serialise {serialize_ms:.3f} ms "
              f"(the process writer does both on the compute thread; the thread writer serialises on its thread)")
        print(f"device {device}; checkpoint size {blob} bytes; {args.steps} steps of {args.side}x{args.side}x9, torch threads "
              f"{args.threads}, moto nice {args.moto_nice}, writer nice {args.writer_nice}; "
              f"load average {load_before:.2f} -> {load_after:.2f} on {os.cpu_count()} CPUs")
        head: dict = {"step_ms_none": round(base * 1000, 2), "cpu_ms_none": round(med("none", "cpu") * 1000, 2)}
        print(f"median none           : {base * 1000:8.2f} ms/step   compute thread CPU {med('none', 'cpu') * 1000:.2f} ms/step, "
              f"preempted {med('none', 'preempted'):.2f}x/step")
        for m in modes[1:]:
            if m == "none-again":
                lo, hi = iqr(m)
                print(f"A/A control    : ratio {statistics.median(ratios[m]):.3f} (IQR {lo:.3f}-{hi:.3f}), the resolution "
                      f"of this box")
                head["aa_ratio"] = round(statistics.median(ratios[m]), 3)
                head["aa_ratio_iqr"] = [round(lo, 3), round(hi, 3)]
                continue
            up = sum(o["written"] for o in res[m])
            sub = sum(o["submitted"] for o in res[m])
            lo, hi = iqr(m)
            print(f"median {m:15s}: {med(m, 'step') * 1000:8.2f} ms/step   ratio {statistics.median(ratios[m]):.3f} "
                  f"(IQR {lo:.3f}-{hi:.3f})   "
                  f"compute thread CPU {med(m, 'cpu') * 1000:.2f} ms/step, preempted {med(m, 'preempted'):.2f}x/step   "
                  f"uploaded {up} of {sub} snapshots ({sub - up} coalesced), max gap {max(o['gap'] for o in res[m])} steps")
            k = m.replace("-", "_")
            head[f"step_ms_{k}"] = round(med(m, "step") * 1000, 2)
            head[f"{k}_ratio"] = round(statistics.median(ratios[m]), 3)
            head[f"{k}_ratio_iqr"] = [round(lo, 3), round(hi, 3)]
            head[f"cpu_ms_{k}"] = round(med(m, "cpu") * 1000, 2)
            head[f"{k}_uploaded_per_run"] = round(up / args.rounds, 1)
            head[f"{k}_max_gap_steps"] = max(o["gap"] for o in res[m])
            if m != "sync":
                head[f"{k}_drain_ms"] = round(med(m, "drain") * 1000, 2)
            if m in ("process", "thread"):
                head[f"{k}_pacer_charged"] = round(med(m, "charged"), 4)
        head.update({"requested_per_run": args.steps // args.every, "every_steps": args.every, "process_start_ms": round(med("process", "start_ms"), 1),
                     "checkpoint_bytes": blob, "snapshot_ms": round(snapshot_ms, 3),
                     "serialize_ms": round(serialize_ms, 3), "side": args.side, "steps": args.steps,
                     "rounds": args.rounds, "seed": args.seed, "device": device, "budget": budget, "torch_threads": args.threads, "moto_nice": args.moto_nice,
                     "writer_nice": args.writer_nice, "load_avg_1m_before": round(load_before, 2),
                     "load_avg_1m_after": round(load_after, 2), "cpus": os.cpu_count()})
        print(json.dumps(head))
    finally:
        moto.terminate()
        moto.wait(10)


if __name__ == "__main__":
    main()
