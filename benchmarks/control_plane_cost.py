"""Control-plane cost per job on each happy path, in USD per 1,000 jobs.

Runs jobs through the synthesized lifecycle state machine on moto (the e2e stack of
benchmarks/cost_stack.py), one at a time, and counts per job:
- state transitions (StateEntered events of the execution history) and Lambda invocations;
- every AWS request made by the control plane (task Lambdas, the state machine's own service
  integrations, the webhook sender, submission + workflow start) by wrapping botocore's
  ``BaseClient._make_api_call``; requests made by the workers and the stand-in scheduler
  (heartbeats, fenced progress/checkpoint writes, polling) are counted apart as "worker".

Prices: AWS public list prices, us-east-1 (documented in docs/benchmarks.md):
Step Functions Standard $0.025 / 1,000 state transitions; Lambda $0.20 / 1M requests +
$0.0000166667 / GB-s (assumed 512 MB x 200 ms per invocation); DynamoDB on-demand $0.625 / 1M WRU,
$0.125 / 1M RRU (transactional items count double; reads counted as 1 RRU per request);
SQS standard $0.40 / 1M requests; S3 PUT/LIST $0.005 / 1,000, GET $0.0004 / 1,000;
EventBridge custom events $1.00 / 1M.

Usage: .venv/bin/python benchmarks/control_plane_cost.py [--jobs N]
Prints a table, then one JSON line with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_REGION": "us-east-1"}.items():
    os.environ[k] = v

PRICES = {
    "sfn_transition": 0.025 / 1000,
    "lambda_request": 0.20 / 1e6,
    "lambda_gb_s": 0.0000166667,
    "lambda_gb_s_per_invoke": 0.5 * 0.2,
    "ddb_wru": 0.625 / 1e6,
    "ddb_rru": 0.125 / 1e6,
    "sqs_request": 0.40 / 1e6,
    "s3_put": 0.005 / 1000,
    "s3_get": 0.0004 / 1000,
    "events_put": 1.00 / 1e6,
}
DDB_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem"}
DDB_READS = {"GetItem", "Query", "Scan", "BatchGetItem"}
S3_PUT_CLASS = {"PutObject", "CopyObject", "ListObjectsV2", "PutObjectTagging"}
S3_GET_CLASS = {"GetObject", "HeadObject", "GetObjectTagging"}

_tag = threading.local()
webhook_invocations = [0]  # SQS event source → webhook sender, per job (reset per job)
calls: Counter = Counter()
tx_items: Counter = Counter()
_lock = threading.Lock()


def _install_counter() -> None:
    from botocore.client import BaseClient

    original = BaseClient._make_api_call

    def counted(self, operation_name, api_params):
        who = getattr(_tag, "who", "control")
        service = self.meta.service_model.service_name
        with _lock:
            calls[(who, service, operation_name)] += 1
            if operation_name in ("TransactWriteItems", "TransactGetItems"):
                tx_items[(who, operation_name)] += len(api_params.get("TransactItems", []))
        return original(self, operation_name, api_params)

    BaseClient._make_api_call = counted


def _as_worker(fn):
    def wrapped(*args, **kwargs):
        _tag.who = "worker"
        return fn(*args, **kwargs)

    return wrapped


def usd(c: dict) -> float:
    ddb_w = c.get("dynamodb_write_units", 0)
    ddb_r = c.get("dynamodb_read_units", 0)
    return (
        c["transitions"] * PRICES["sfn_transition"]
        + c["lambda_invocations"] * (PRICES["lambda_request"] + PRICES["lambda_gb_s"] * PRICES["lambda_gb_s_per_invoke"])
        + ddb_w * PRICES["ddb_wru"] + ddb_r * PRICES["ddb_rru"]
        + c["sqs_requests"] * PRICES["sqs_request"]
        + c["s3_put"] * PRICES["s3_put"] + c["s3_get"] * PRICES["s3_get"]
        + c["events_put"] * PRICES["events_put"]
    )


def summarise(delta: Counter, txd: Counter, who: str, history: list[dict]) -> dict:
    mine = {(s, o): n for (w, s, o), n in delta.items() if w == who}
    ddb_w = sum(n for (s, o), n in mine.items() if s == "dynamodb" and o in DDB_WRITES)
    ddb_w += 2 * txd.get((who, "TransactWriteItems"), 0)
    ddb_r = sum(n for (s, o), n in mine.items() if s == "dynamodb" and o in DDB_READS)
    ddb_r += 2 * txd.get((who, "TransactGetItems"), 0)
    out = {
        "dynamodb_requests": sum(n for (s, _), n in mine.items() if s == "dynamodb"),
        "dynamodb_write_units": ddb_w,
        "dynamodb_read_units": ddb_r,
        "sqs_requests": sum(n for (s, _), n in mine.items() if s == "sqs"),
        "s3_put": sum(n for (s, o), n in mine.items() if s == "s3" and o in S3_PUT_CLASS),
        "s3_get": sum(n for (s, o), n in mine.items() if s == "s3" and o in S3_GET_CLASS),
        "events_put": sum(n for (s, o), n in mine.items() if s == "events"),
        "transitions": 0,
        "lambda_invocations": 0,
    }
    if who == "control":
        out["transitions"] = sum(1 for e in history if e["type"].endswith("StateEntered"))
        out["lambda_invocations"] = sum(
            1 for e in history
            if e["type"] == "TaskScheduled" and e["taskScheduledEventDetails"]["resourceType"] == "lambda"
        ) + webhook_invocations[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3, help="jobs per happy path")
    args = ap.parse_args()
    _install_counter()
    from cost_fleet import Fleet, Plan
    from cost_stack import deploy, install_patches, wait_for
    from moto import mock_aws

    from gpufleet.store import jobs
    from gpufleet.tables import TableNames

    mock = mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "batch": {"use_docker": False}})
    mock.start()
    holder: dict = {}
    undo = install_patches(_as_worker(lambda job: holder["fleet"].batch_runner(job)))
    t0 = time.time()
    stack = deploy(["node-1"])
    fleet = holder["fleet"] = Fleet(stack)
    fleet._spawn = (lambda orig: (lambda target, *a: orig(_as_worker(target), *a)))(fleet._spawn)
    from lambdas.tasks import _deps

    _deps.override(prompt_check=lambda text: {"allowed": True, "reason": None})
    from lambdas.tasks import webhook_sender

    sender = webhook_sender.handler

    def counted_sender(event, context=None):
        webhook_invocations[0] += 1
        return sender(event, context)

    webhook_sender.handler = counted_sender
    fleet.start()
    sfn, ddb = stack.c("stepfunctions"), stack.c("dynamodb")
    results: dict[str, dict] = {}
    webhook_url = "http://127.0.0.1:9/unused"  # delivery attempt counted; receiver not needed for cost
    for path, target in (("onprem", ("onprem", "node-1")), ("cloud", ("cloud", "cloud-ondemand"))):
        per_job = []
        for _ in range(args.jobs):
            before, tx_before = Counter(calls), Counter(tx_items)
            webhook_invocations[0] = 0
            spec = {"workload": {"kind": "video.generate", "prompt": "a lighthouse at dawn"},
                    "webhook": {"url": webhook_url, "events": ["completed"]}}
            job = jobs.create_job(ddb, TableNames(), tenant="acme", team="t", user="u", spec=spec)
            fleet.plans[job["job_id"]] = Plan(targets=[target])
            arn = sfn.start_execution(stateMachineArn=stack.state_machine_arn, name=job["job_id"],
                                      input=json.dumps({"job_id": job["job_id"]}))["executionArn"]
            wait_for(lambda a=arn: sfn.describe_execution(executionArn=a)["status"] != "RUNNING", 60)
            history = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
            delta = Counter(calls)
            delta.subtract(before)
            txd = Counter(tx_items)
            txd.subtract(tx_before)
            # reads of the history itself are the benchmark's, not the control plane's
            delta[("control", "stepfunctions", "GetExecutionHistory")] -= 1
            control = summarise(delta, txd, "control", history)
            worker = summarise(delta, txd, "worker", history)
            per_job.append({"control": control, "worker": worker,
                            "status": jobs.get_job(ddb, TableNames().jobs, job["job_id"])["status"]})
        avg = {k: sum(j["control"][k] for j in per_job) / len(per_job) for k in per_job[0]["control"]}
        wavg = {k: sum(j["worker"][k] for j in per_job) / len(per_job) for k in per_job[0]["worker"]}
        results[path] = {"control": avg, "worker": wavg, "usd_per_1000": 1000 * usd(avg),
                         "worker_usd_per_1000": 1000 * usd(wavg),
                         "statuses": sorted({j["status"] for j in per_job})}
    fleet.stop()
    undo()
    mock.stop()
    print(f"control-plane cost per job (average of {args.jobs} jobs per path; run {time.time() - t0:.1f}s)")
    cols = ["transitions", "lambda_invocations", "dynamodb_requests", "dynamodb_write_units",
            "dynamodb_read_units", "sqs_requests", "s3_put", "s3_get", "events_put"]
    print(f"{'path':8} " + " ".join(f"{c[:14]:>14}" for c in cols) + f" {'USD/1000 jobs':>14}")
    for path, r in results.items():
        print(f"{path:8} " + " ".join(f"{r['control'][c]:>14.1f}" for c in cols) + f" {r['usd_per_1000']:>14.4f}")
        print(f"{'  worker':8} " + " ".join(f"{r['worker'][c]:>14.1f}" for c in cols)
              + f" {r['worker_usd_per_1000']:>14.4f}")
    ratio = results["cloud"]["usd_per_1000"] / results["onprem"]["usd_per_1000"]
    print(f"cloud / on-prem control-plane cost ratio: {ratio:.2f}")
    print(json.dumps({
        "onprem_usd_per_1000_jobs": round(results["onprem"]["usd_per_1000"], 4),
        "cloud_usd_per_1000_jobs": round(results["cloud"]["usd_per_1000"], 4),
        "onprem_transitions": results["onprem"]["control"]["transitions"],
        "cloud_transitions": results["cloud"]["control"]["transitions"],
        "onprem_lambda_invocations": results["onprem"]["control"]["lambda_invocations"],
        "cloud_lambda_invocations": results["cloud"]["control"]["lambda_invocations"],
        "cloud_over_onprem": round(ratio, 3),
        "statuses": {p: r["statuses"] for p, r in results.items()},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
