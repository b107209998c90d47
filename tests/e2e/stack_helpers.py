"""Driving the real embedded stack (``gpufleet dev`` in its own process) from the e2e suite.

Nothing here stands in for a part of gpufleet: :class:`StackProcess` starts and stops the real
``gpufleet dev``; :class:`World` reads the stack's DynamoDB, S3, Batch and Step Functions through
boto3 against its moto server (addresses from ``<state>/stack.json``); the fault helpers act on the
real processes from outside, as an operator or the kernel would (SIGSTOP a node's agent and its jobs,
SIGKILL a job's runtime process), and :class:`Receiver` is the webhook endpoint a user would run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import psutil

from gpufleet.store import jobs, ledger
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.tables import attempt_sk, job_pk

REPO = Path(__file__).resolve().parents[2]

# ---- the session's stack (tests/e2e/conftest.py)
READY_TIMEOUT_S = 240
#: the Run state's HeartbeatSeconds in this stack: how long a silent agent is trusted
HEARTBEAT_S = 12
AGENTS = 3
#: FinalizeRoute's bound on the e2e stack: the scenarios' 5-frame clips (5 × 256 × 256 delivered pixels) finalize
#: in the warm FinalizeLambda, a 9-frame clip (BATCH_FINALIZE_FRAMES) in the local Batch runner
FINALIZE_LAMBDA_MAX_PIXELS = 6 * 256 * 256
BATCH_FINALIZE_FRAMES = 9

#: runtime settings for every job: progress and spot polling often enough for the tests to
#: act mid-run, a checkpoint every 2 denoising steps, one torch thread (three agents share 2 cores)
RUNTIME_ENV = {
    "GPUFLEET_PROGRESS_INTERVAL_S": "0.2",
    "GPUFLEET_SPOT_POLL_S": "0.2",
    "GPUFLEET_CHECKPOINT_EVERY_STEPS": "2",
    "GPUFLEET_LOG_FLUSH_S": "1",
    "GPUFLEET_TORCH_THREADS": "1",
}


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class StackProcess:
    """``gpufleet dev`` as a child process: started until it says ready, stopped with Ctrl-C (SIGINT)."""

    def __init__(self, state: Path, args: list[str]) -> None:
        self.state = state
        self.args = args
        self.log = state / "dev.out"
        self.proc: subprocess.Popen | None = None

    def start(self, ready_timeout_s: float) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUFLEET_", "MOTO_"))}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.cli.main", "dev", "--state-dir", str(self.state), *self.args],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout_s
        while "gpufleet dev: ready" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"gpufleet dev did not become ready:\n{self.tail()}")
            time.sleep(0.25)
        return self.manifest()

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.state / "stack.json").read_text())

    def tail(self, chars: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        stack_log = self.state / "logs" / "stack.log"
        if stack_log.exists():
            text += "\n--- stack.log ---\n" + stack_log.read_text(errors="replace")[-chars:]
        return text[-2 * chars:]

    def stop(self, timeout_s: float = 60) -> int:
        """Ctrl-C; the exit code (the process group is killed if it does not stop in time)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class World:
    """Read access to the stack's AWS resources (moto server) and its processes, from stack.json."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        self.m = manifest
        self.region = manifest["region"]
        self.endpoint = manifest["moto_endpoint"]
        self.tables = manifest["tables"]
        self.buckets = manifest["buckets"]
        self.state_machine_arn = manifest["state_machine_arn"]
        self.agents: dict[str, int] = {a["node_id"]: int(a["pid"]) for a in manifest["agents"]}
        self.stack_pid = int(manifest["pid"])
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def c(self, service: str):
        """A boto3 client against the moto server (made once; clients are thread-safe, making them is not)."""
        with self._lock:
            if service not in self._clients:
                self._clients[service] = boto3.client(
                    service, region_name=self.region, endpoint_url=self.endpoint,
                    aws_access_key_id="testing", aws_secret_access_key="testing",
                )
            return self._clients[service]

    # ---- the job's records

    def job(self, job_id: str) -> dict[str, Any]:
        return jobs.get_job(self.c("dynamodb"), self.tables["jobs"], job_id)

    def attempt(self, job_id: str, epoch: int) -> dict[str, Any] | None:
        got = self.c("dynamodb").get_item(TableName=self.tables["jobs"],
                                          Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}),
                                          ConsistentRead=True)
        return unmarshal(got.get("Item"))

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        """The scheduler's attempt items of the job, oldest first (epochs need not be contiguous: a
        retry bumps the epoch to fence the failed attempt off before the next placement)."""
        got = self.c("dynamodb").query(
            TableName=self.tables["jobs"], ConsistentRead=True,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :a)",
            ExpressionAttributeValues={":pk": {"S": job_pk(job_id)}, ":a": {"S": "ATTEMPT#"}},
        )
        return [unmarshal(i) for i in got["Items"]]

    def control(self, pk: str, sk: str) -> dict[str, Any] | None:
        got = self.c("dynamodb").get_item(TableName=self.tables["control"], Key=marshal({"pk": pk, "sk": sk}),
                                          ConsistentRead=True)
        return unmarshal(got.get("Item"))

    def holders(self, node: str) -> str:
        """Who holds GPUs of ``node``: its BOOK counters and each allocation record's job, status and attempt
        (the diagnostic of a booking that is never given back)."""
        got = self.c("dynamodb").query(
            TableName=self.tables["control"], ConsistentRead=True, KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": f"ALLOC#{node}"}})
        lines = []
        for item in map(unmarshal, got["Items"]):
            if item["sk"] == "BOOK" or "#" not in item["sk"]:
                lines.append(f"{node} {item['sk']}: " + json.dumps({k: v for k, v in item.items()
                                                                    if k.startswith("g")}, default=str))
                continue
            job_id, epoch = item["sk"].rsplit("#", 1)
            job = self.job(job_id) or {}
            attempt = self.attempt(job_id, int(epoch)) or {}
            lines.append(f"{node} {item['sk']}: job {job.get('status')} epoch {job.get('current_epoch')}, attempt "
                         + json.dumps({k: attempt.get(k) for k in ("state", "released_at", "ended_at", "outcome")},
                                      default=str)
                         + f"\n  {self.describe_history(job_id).splitlines()[-4:]}")
        return "\n".join(lines)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return jobs.list_events(self.c("dynamodb"), self.tables["jobs"], job_id)

    def ledger(self, job_id: str) -> list[dict[str, Any]]:
        return ledger.entries(self.c("dynamodb"), self.tables["ledger"], job_id)

    def execution_arn(self, job_id: str) -> str:
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"

    def history(self, job_id: str) -> list[dict[str, Any]]:
        return self.c("stepfunctions").get_execution_history(executionArn=self.execution_arn(job_id))["events"]

    def describe_history(self, job_id: str) -> str:
        try:
            events = self.history(job_id)
        except Exception as err:  # noqa: BLE001 - diagnostics only
            return f"(no history: {err})"
        return "\n".join(
            f"{e['type']} {json.dumps({k: v for k, v in e.items() if k.endswith('Details')}, default=str)[:300]}"
            for e in events if e["type"].endswith(("Entered", "Failed", "TimedOut", "Succeeded", "Aborted"))
        )

    def batch_jobs(self, job_id: str) -> list[dict[str, Any]]:
        """Every Batch job the workflow submitted for ``job_id`` (any queue), oldest first."""
        batch = self.c("batch")
        found = []
        for queue in batch.describe_job_queues()["jobQueues"]:
            for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"):
                for j in batch.list_jobs(jobQueue=queue["jobQueueArn"], jobStatus=status)["jobSummaryList"]:
                    if job_id in j["jobName"]:
                        found.append({**j, "queue": queue["jobQueueName"]})
        return sorted(found, key=lambda j: j.get("createdAt", 0))

    # ---- processes

    def lambda_workers(self, handler: str = "lambdas.tasks.finalize.handler") -> list[psutil.Process]:
        """The stack's Lambda worker processes (gpufleet.local.lambda_worker) of ``handler``: FinalizeLambda's
        execution environments."""
        found = []
        for proc in _descendants(self.stack_pid):
            try:
                argv = proc.cmdline()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            if "gpufleet.local.lambda_worker" in argv and handler in argv:
                found.append(proc)
        return found

    def runtime_processes(self, job_id: str, stage: str | None = None, root: int | None = None) -> list[psutil.Process]:
        """Live runtime processes of ``job_id`` under ``root`` (default: the whole stack): a fresh
        ``python -m gpufleet.runtime`` (its envelope on its command line), or the warm worker an agent handed the
        job's ``generate`` stage to (the agent's running-job record names its pid)."""
        found = []
        below = _descendants(root or self.stack_pid)
        forked = self.batch_forked()
        for proc in below:
            try:
                argv = forked[proc.pid] if proc.pid in forked else proc.cmdline()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            if "gpufleet.runtime" not in argv:
                continue
            envelope = _envelope_of(argv)
            if envelope.get("job_id") == job_id and (stage is None or envelope.get("stage") == stage):
                found.append(proc)
        if stage in (None, "generate"):
            pids = {p.pid for p in below}
            found += [p for p in self.warm_workers_running(job_id) if p.pid in pids and p not in found]
        return found

    def batch_forked(self) -> dict[int, list[str]]:
        """The local Batch runner's running attempts forked from its pre-warmed server (their command line is the
        server's): pid -> the ``python -m MODULE ARGS`` they run, from the records it keeps
        (``stack.json``'s ``batch_running``, :mod:`gpufleet.local.prewarmed`)."""
        out: dict[int, list[str]] = {}
        for record in Path(self.m.get("batch_running", "/nonexistent")).glob("*.json"):
            try:
                r = json.loads(record.read_text())
                out[int(r["pid"])] = ["python", "-m", r["module"], *r["argv"]]
            except (OSError, ValueError, KeyError):
                continue
        return out

    def warm_workers_running(self, job_id: str) -> list[psutil.Process]:
        """The warm workers (``python -m gpufleet.runtime.worker``) running ``job_id`` now, from the agents'
        running-job records (``<state>/running/<job_id>@<epoch>.json``)."""
        found = []
        for agent in self.m["agents"]:
            for record in Path(agent.get("state_dir", "/nonexistent"), "running").glob(f"{job_id}@*.json"):
                try:
                    proc = psutil.Process(int(json.loads(record.read_text())["pid"]))
                    if "gpufleet.runtime.worker" in proc.cmdline():
                        found.append(proc)
                except (OSError, ValueError, KeyError, psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
        return found


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _envelope_of(argv: list[str]) -> dict[str, Any]:
    try:
        if "--envelope-json" in argv:
            return json.loads(argv[argv.index("--envelope-json") + 1])
        if "--envelope-file" in argv:
            return json.loads(Path(argv[argv.index("--envelope-file") + 1]).read_text())
    except (OSError, ValueError, IndexError):
        pass
    return {}


def signal_tree(pid: int, sig: signal.Signals) -> list[int]:
    """Send ``sig`` to ``pid`` and every process below it (children first for SIGSTOP's sake); the pids hit."""
    procs = [*_descendants(pid)]
    try:
        procs.append(psutil.Process(pid))
    except psutil.NoSuchProcess:
        pass
    hit = []
    for proc in procs:
        try:
            proc.send_signal(sig)
            hit.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return hit


class Receiver:
    """A loopback HTTP endpoint recording webhook POSTs (what a user's service would be)."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append({"headers": dict(self.headers.items()), "body": body})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def for_job(self, job_id: str) -> list[dict]:
        return [r for r in self.received if json.loads(r["body"])["data"]["job_id"] == job_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def as_operator(world) -> None:
    """The developer's principal becomes an operator (admin) — what onboarding an operator does."""
    from gpufleet.store.dynamo import unmarshal
    from gpufleet.store.principals import put_principal

    ddb, table = world.c("dynamodb"), world.tables["control"]
    for raw in ddb.scan(TableName=table)["Items"]:
        item = unmarshal(raw)
        if str(item["pk"]).startswith("PRINCIPAL#") and item.get("tenant") == "dev":
            put_principal(ddb, table, item["arn"], item["tenant"], item["team"], item["user"], admin=True)
