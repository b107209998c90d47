"""A small, real worker that follows the runtime contract (docs/contracts.md, "Runtime").

The agent tests run it in place of ``python -m gpufleet.runtime`` so a job's
behaviour can be steered (length, crash, ignoring SIGTERM, a grandchild
process, a model to load) through the envelope's ``spec.workload.env``:

STEPS, STEP_S      number and duration of steps
CKPT_EVERY         checkpoint every k steps (S3 object + fenced pointer on the job)
CRASH_AT           step at which the process kills itself with SIGSEGV
IGNORE_TERM        "1": ignore SIGTERM (only SIGKILL ends it)
HOLD_AT            an attempt of epoch HOLD_EPOCH (default 1) stops before this step until SIGTERM (at most
                   120 s), so a test's signal finds it mid-run however slow the host is
GRANDCHILD         "1": start a `sleep` grandchild in the same process group
MODEL_SHA, MODEL_BUCKET, MODEL_KEY
                   load this blob through the node cache (GPUFLEET_CACHE_DIR) before step 0
RECORD_FILE        append JSON lines {"job", "epoch", "event", "step", "pid", "t", ...}; "start"
                   also records CUDA_VISIBLE_DEVICES ("cuda") and the torchrun variables ("dist")

Contract behaviour: resumes from the job's checkpoint pointer (verifying the
object's SHA-256); every write (checkpoint pointer + progress every CKPT_EVERY
steps, the output pointer at the end) is fenced on the envelope's epoch (a stale
epoch → exit FENCED); SIGTERM → checkpoint at the next step boundary → exit
PREEMPTED; at the end writes the output and the fenced ``generated`` pointer → exit 0.
Like the real runtime on a node it reaches the job only through the node API
(``GPUFLEET_NODE_API_URL``, the node's credentials) and objects with the attempt's
scoped credentials (:func:`gpufleet.store.nodeapi.worker_adapters`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

from gpufleet.clock import SystemClock
from gpufleet.envelope import Envelope, ExitCode
from gpufleet.errors import StaleEpoch
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.store.nodeapi import worker_adapters

#: the torchrun-style variables a gang member gets (recorded in the "start" event)
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envelope-file", required=True)
    args = ap.parse_args()
    with open(args.envelope_file) as fh:
        env = Envelope.model_validate_json(fh.read())
    cfg = env.spec.workload.env
    steps = int(cfg.get("STEPS", "10"))
    step_s = float(cfg.get("STEP_S", "0.05"))
    every = int(cfg.get("CKPT_EVERY", "5"))
    crash_at = int(cfg.get("CRASH_AT", "-1"))
    hold_at = int(cfg.get("HOLD_AT", "-1")) if env.epoch == int(cfg.get("HOLD_EPOCH", "1")) else -1
    record_file = cfg.get("RECORD_FILE")
    table = env.tables.get("jobs") or os.environ["GPUFLEET_JOBS_TABLE"]
    job, objects = worker_adapters(table=table, job_id=env.job_id, epoch=env.epoch,
                                   node_api_url=os.environ["GPUFLEET_NODE_API_URL"],
                                   node_id=os.environ.get("GPUFLEET_NODE_ID"), region=os.environ["AWS_REGION"],
                                   clock=SystemClock())
    s3 = objects.client

    def record(event: str, **kw) -> None:
        if record_file:
            line = json.dumps({"job": env.job_id, "epoch": env.epoch, "event": event, "pid": os.getpid(),
                               "t": time.time(), **kw})
            with open(record_file, "a") as fh:
                fh.write(line + "\n")

    term = {"set": False}
    if cfg.get("IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: term.__setitem__("set", True))
    if cfg.get("GRANDCHILD") == "1":
        gc = subprocess.Popen(["sleep", "120"])
        record("grandchild", grandchild_pid=gc.pid)

    def checkpoint(next_step: int) -> None:
        body = json.dumps({"next_step": next_step}).encode()
        key = f"{env.s3.checkpoint_prefix}ckpt-{env.epoch:04d}-{next_step:06d}.json"
        s3.put_object(Bucket=env.s3.bucket_checkpoints, Key=key, Body=body)
        job.set_checkpoint(key, hashlib.sha256(body).hexdigest(), next_step)
        job.set_progress(next_step, steps)
        record("checkpoint", step=next_step)

    try:
        item = job.check_current()
        start = 0
        ckpt = item.get("checkpoint")
        if ckpt:
            body = s3.get_object(Bucket=env.s3.bucket_checkpoints, Key=ckpt["key"])["Body"].read()
            if hashlib.sha256(body).hexdigest() == ckpt["sha256"]:
                start = int(json.loads(body)["next_step"])
        record("start", step=start, cuda=os.environ.get("CUDA_VISIBLE_DEVICES"),
               dist={k: os.environ[k] for k in DIST_VARS if k in os.environ})
        if cfg.get("MODEL_SHA"):
            cache = ContentCache.from_env(max_bytes=int(cfg.get("CACHE_MAX", str(1 << 40))))
            bucket, key = cfg["MODEL_BUCKET"], cfg["MODEL_KEY"]
            path, hit = cache.fetch(cfg["MODEL_SHA"], lambda p: s3.download_file(bucket, key, str(p)))
            with cache.pinned(cfg["MODEL_SHA"]):
                with open(path, "rb") as fh:  # "load the weights"
                    while fh.read(1 << 22):
                        pass
            record("model_loaded", hit=hit)
        record("workload_started", step=start)
        for k in range(start, steps):
            if k == hold_at:
                held_until = time.monotonic() + 120
                while not term["set"] and time.monotonic() < held_until:
                    time.sleep(0.02)
            if term["set"]:
                checkpoint(k)
                record("preempted", step=k)
                return ExitCode.PREEMPTED
            if k == crash_at:
                record("crash", step=k)
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(step_s)
            record("step", step=k)
            if (k + 1) % every == 0 and k + 1 < steps:
                checkpoint(k + 1)
        out = json.dumps({"job": env.job_id, "steps": steps}).encode()
        key = f"{env.s3.output_prefix}generated.json"
        s3.put_object(Bucket=env.s3.bucket_outputs, Key=key, Body=out)
        job.set_generated({"key": key, "sha256": hashlib.sha256(out).hexdigest()})
        job.set_progress(steps, steps)
        record("done", step=steps)
        return ExitCode.SUCCEEDED
    except StaleEpoch:
        record("fenced")
        return ExitCode.FENCED


if __name__ == "__main__":
    sys.exit(int(main()))
