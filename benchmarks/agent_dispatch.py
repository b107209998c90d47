"""Benchmark: on-prem agent dispatch latency and GPU idle gap, warm cache vs cold, in one run.

Everything is real except AWS, which is a moto server on 127.0.0.1 (a separate
process): one agent process (`python -m onprem_agent`, one slot, prefetch 1)
long-polls its node queue; each job is a fresh worker process (the contract
runtime of tests/functional/agent) that loads a model blob through the node
cache before its first step.

Figures:
- dispatch: message sent → worker process running ("start") and → workload
  started (model loaded), one job at a time on an idle agent, warm cache.
- idle gap: back-to-back jobs queued at once; gap = next job's workload start −
  previous job's end. Cold: every job needs a different model (cache miss →
  download from S3 + verify); warm: every job uses the same, already cached model.

Usage: .venv/bin/python benchmarks/agent_dispatch.py [--jobs 4] [--model-mib 64]
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import boto3
import requests
import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpufleet.store.dynamo import marshal  # noqa: E402
from gpufleet.store.schema import create_tables  # noqa: E402
from gpufleet.tables import JOB_META, TableNames, job_pk  # noqa: E402

RUNTIME = REPO / "tests" / "functional" / "agent" / "contract_runtime.py"
AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
       "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env=dict(os.environ, MOTO_PORT=str(port)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(url + "/moto-api/", timeout=1)
            return proc, url
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("moto server did not start") from None
            time.sleep(0.1)


class Bench:
    def __init__(self, url: str, root: Path, model_mib: int) -> None:
        kw = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "bench",
              "aws_secret_access_key": "bench"}
        self.ddb, self.sqs, self.s3 = (boto3.client(s, **kw) for s in ("dynamodb", "sqs", "s3"))
        tag = uuid.uuid4().hex[:8]
        self.tables = TableNames(jobs=f"jobs-{tag}", control=f"control-{tag}", ledger=f"ledger-{tag}")
        create_tables(self.ddb, self.tables)
        self.bucket = f"bench-{tag}"
        self.s3.create_bucket(Bucket=self.bucket)
        self.queue = self.sqs.create_queue(QueueName=f"node-bench-{tag}")["QueueUrl"]
        self.root = root
        self.records = root / "records.jsonl"
        self.records.touch()
        self.url = url
        self.model_bytes = model_mib * 1024 * 1024
        self.seq = 0

    def model(self, name: str) -> tuple[str, str]:
        data = hashlib.sha256(name.encode()).digest() * (self.model_bytes // 32)
        key = f"models/{name}.bin"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        return key, hashlib.sha256(data).hexdigest()

    def agent(self) -> subprocess.Popen:
        cfg = {"node_id": "bench", "pool": "onprem-bench", "queue_url": self.queue, "endpoint_url": self.url,
               "jobs_table": self.tables.jobs, "control_table": self.tables.control,
               "state_dir": str(self.root / "state"), "cache_dir": str(self.root / "cache"),
               "cache_max_bytes": 64 * self.model_bytes, "cpu_slots": 1, "prefetch": 1,
               "runtime_command": [sys.executable, str(RUNTIME)], "poll_wait_s": 20, "visibility_timeout_s": 60,
               "heartbeat_interval_s": 5.0, "node_heartbeat_s": 10.0, "node_ttl_s": 30, "metrics_port": 0}
        path = self.root / "agent.toml"
        path.write_text(tomli_w.dumps({"agent": cfg}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUFLEET_"))}
        env.update(AWS, PYTHONPATH=str(REPO))
        log = open(self.root / "agent.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "onprem_agent", "--config", str(path)], env=env, cwd=str(REPO),
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while b"agent started" not in (self.root / "agent.log").read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("agent did not start:\n" + (self.root / "agent.log").read_text()[-2000:])
            time.sleep(0.05)
        return proc

    def send(self, model: tuple[str, str], steps: int = 3) -> tuple[str, float]:
        self.seq += 1
        job_id = f"job-{self.seq:03d}"
        spec = {"workload": {"kind": "container", "image": "bench", "command": ["run"], "env": {
            "STEPS": str(steps), "STEP_S": "0.05", "CKPT_EVERY": "1000", "RECORD_FILE": str(self.records),
            "MODEL_BUCKET": self.bucket, "MODEL_KEY": model[0], "MODEL_SHA": model[1]}}}
        self.ddb.put_item(TableName=self.tables.jobs, Item=marshal({
            "pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "status": "SCHEDULED", "current_epoch": 1,
            "spec": spec}))
        env = {"job_id": job_id, "attempt": 1, "epoch": 1, "stage": "container", "spec": spec,
               "s3": {"bucket_outputs": self.bucket, "bucket_checkpoints": self.bucket, "bucket_logs": self.bucket,
                      "output_prefix": f"jobs/{job_id}/", "checkpoint_prefix": f"jobs/{job_id}/",
                      "log_prefix": f"jobs/{job_id}/attempt-0001/"},
               "placement": {"pool": "onprem-bench", "node": "bench", "gpu_indices": [0]},
               "tables": {"jobs": self.tables.jobs}}
        t = time.time()
        self.sqs.send_message(QueueUrl=self.queue, MessageBody=json.dumps(env))
        return job_id, t

    def events(self) -> dict[tuple[str, str], dict]:
        out = {}
        for line in self.records.read_text().splitlines():
            r = json.loads(line)
            out[(r["job"], r["event"])] = r
        return out

    def wait_done(self, job_ids: list[str], timeout: float = 300) -> dict[tuple[str, str], dict]:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.events()
            if all((j, "done") in ev for j in job_ids):
                return ev
            if time.monotonic() > deadline:
                raise SystemExit(f"jobs {job_ids} did not finish")
            time.sleep(0.05)


def spawn_times(log: Path) -> dict[str, float]:
    """job id → when the agent spawned its worker (the agent's "job started" log line)."""
    out = {}
    for line in log.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("msg") == "job started":
            out[r["job_id"]] = datetime.fromisoformat(r["ts"].replace("Z", "+00:00")).timestamp()
    return out


def gaps(ev: dict, jobs: list[str]) -> list[float]:
    order = sorted(jobs, key=lambda j: ev[(j, "start")]["t"])
    return [ev[(b, "workload_started")]["t"] - ev[(a, "done")]["t"] for a, b in zip(order, order[1:], strict=False)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=4, help="back-to-back jobs per phase (and dispatch samples)")
    ap.add_argument("--model-mib", type=int, default=64)
    args = ap.parse_args()
    moto, url = start_moto()
    agent = None
    try:
        with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp:
            b = Bench(url, Path(tmp), args.model_mib)
            warm_model = b.model("warm")
            cold_models = [b.model(f"cold-{i}") for i in range(args.jobs + 1)]
            agent = b.agent()

            # 1. warm the cache, then dispatch latency one job at a time on an idle agent
            b.wait_done([b.send(warm_model)[0]])
            to_spawn, to_start, to_work = [], [], []
            for _ in range(args.jobs):
                job, t_sent = b.send(warm_model)
                ev = b.wait_done([job])
                to_spawn.append(spawn_times(b.root / "agent.log")[job] - t_sent)
                to_start.append(ev[(job, "start")]["t"] - t_sent)
                to_work.append(ev[(job, "workload_started")]["t"] - t_sent)
                time.sleep(0.3)  # agent idle, long-polling

            # 2. back-to-back, cold: every job a model the node has not cached
            cold_jobs = [b.send(m)[0] for m in cold_models]
            ev = b.wait_done(cold_jobs)
            cold = gaps(ev, cold_jobs)
            assert not any(ev[(j, "model_loaded")]["hit"] for j in cold_jobs)

            # 3. back-to-back, warm: the same cached model each time
            warm_jobs = [b.send(warm_model)[0] for _ in range(args.jobs + 1)]
            ev = b.wait_done(warm_jobs)
            warm = gaps(ev, warm_jobs)
            assert all(ev[(j, "model_loaded")]["hit"] for j in warm_jobs)
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(60)
        moto.terminate()
        moto.wait(10)

    def ms(xs):
        return [round(x * 1000, 1) for x in xs]

    print(f"model size: {args.model_mib} MiB; {args.jobs} samples per figure; AWS = moto server on 127.0.0.1")
    print(f"dispatch, message → worker spawned by agent (ms): {ms(to_spawn)}  median {statistics.median(to_spawn)*1000:.0f}")
    print(f"dispatch, message → worker process started  (ms): {ms(to_start)}  median {statistics.median(to_start)*1000:.0f}")
    print(f"dispatch, message → workload started        (ms): {ms(to_work)}  median {statistics.median(to_work)*1000:.0f}")
    print(f"idle gap back-to-back, cold cache (ms): {ms(cold)}  mean {statistics.mean(cold)*1000:.0f}")
    print(f"idle gap back-to-back, warm cache (ms): {ms(warm)}  mean {statistics.mean(warm)*1000:.0f}")
    ratio = statistics.mean(warm) / statistics.mean(cold)
    print(f"warm / cold idle gap: {ratio:.2f}")
    print(json.dumps({
        "dispatch_to_spawn_median_s": round(statistics.median(to_spawn), 3),
        "dispatch_to_process_median_s": round(statistics.median(to_start), 3),
        "dispatch_to_workload_median_s": round(statistics.median(to_work), 3),
        "idle_gap_cold_mean_s": round(statistics.mean(cold), 3),
        "idle_gap_warm_mean_s": round(statistics.mean(warm), 3),
        "idle_gap_warm_over_cold": round(ratio, 3),
        "model_mib": args.model_mib,
        "samples": args.jobs,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
