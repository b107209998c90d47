"""Fixtures for the agent's functional tests: a moto server (separate process), a tiny
state machine with one ``waitForTaskToken`` Run state, the node API behind a SigV4-verifying
loopback gateway, and agent processes.

The :class:`Fleet` plays the parts of the API, scheduler, lifecycle and operator that the
agent talks to: it registers nodes, writes job items and attempt items (the placement names the
node), issues fencing epochs, starts executions, and dispatches each Run state as the deployed
``dispatch_onprem`` Lambda does (:func:`gpufleet.nodeapi.dispatch.dispatch`: the task token is
stored on the attempt item, the node's queue gets the envelope without it), and sets
``cancel_requested``. Each agent signs its node API calls with its own access key, which the
gateway maps to that node's agent session, so a node is who its credentials say.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest
import requests
import tomli_w
from botocore.credentials import Credentials

from gpufleet.clock import SystemClock
from gpufleet.devstack.gateway import Gateway, LocalCredential
from gpufleet.nodeapi.dispatch import dispatch
from gpufleet.nodeapi.identity import agent_session_arn
from gpufleet.nodeapi.liveness import Registration
from gpufleet.nodeapi.settings import NodeApiSettings, build_api
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.nodeapi import NodeApiClient
from gpufleet.store.nodes import DynamoNodeStore
from gpufleet.store.runs import DynamoRunStore
from gpufleet.store.schema import create_tables
from gpufleet.tables import JOB_META, TableNames, attempt_sk, job_pk, node_pk

REPO = Path(__file__).resolve().parents[3]
CONTRACT_RUNTIME = Path(__file__).with_name("contract_runtime.py")
HEARTBEAT_SECONDS = 3  # default HeartbeatSeconds of the Run state: a silent agent is timed out after this
GANG_SILENCE_S = 3.0  # the node API fails a started gang whose member has been silent this long
GANG_BARRIER_S = 30.0  # ... and one whose members were not all ready this long after dispatch


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto server in its own process that executes state machines (MOTO_PORT lets them call back), with the
    patches that only make moto answer faster (gpufleet.local.moto_server)."""
    port = _free_port()
    env = dict(os.environ, MOTO_PORT=str(port))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.local.moto_server", "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"{url}/moto-api/", timeout=1)
            break
        except requests.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.1)
    requests.post(f"{url}/moto-api/config", json={"stepfunctions": {"execute_state_machine": True}}, timeout=5)
    yield url
    proc.terminate()
    try:
        proc.wait(3)  # nothing to flush: a server still running executions' threads is killed
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1"}


AGENT_ROLE = "gpufleet-agent"
ACCOUNT = "123456789012"


def state_machine_definition(dispatch_queue: str, heartbeat_s: int = HEARTBEAT_SECONDS) -> dict:
    """The Run state: its payload is what the deployed RunOnPrem gives ``dispatch_onprem``; here it goes to a
    control-plane queue the Fleet dispatches from (moto's server runs no Lambdas in this suite)."""
    return {
        "StartAt": "RunOnPrem",
        "States": {
            "RunOnPrem": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                "HeartbeatSeconds": heartbeat_s,
                "TimeoutSeconds": 300,
                "Parameters": {"QueueUrl": dispatch_queue,
                               "MessageBody": {"job_id.$": "$.job_id", "token.$": "$$.Task.Token", "run.$": "$.run"}},
                "End": True,
            }
        },
    }


class Fleet:
    """The control plane around the agents, on the moto server."""

    def __init__(self, endpoint: str, root: Path) -> None:
        self.endpoint = endpoint
        self.root = root
        kw = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing",
              "aws_secret_access_key": "testing"}
        self.ddb = boto3.client("dynamodb", **kw)
        self.sqs = boto3.client("sqs", **kw)
        self.sfn = boto3.client("stepfunctions", **kw)
        self.s3 = boto3.client("s3", **kw)
        tag = uuid.uuid4().hex[:8]
        self.tag = tag
        self.tables = TableNames(jobs=f"jobs-{tag}", control=f"control-{tag}", ledger=f"ledger-{tag}")
        create_tables(self.ddb, self.tables)
        self.bucket = f"gpufleet-{tag}"
        self.s3.create_bucket(Bucket=self.bucket)
        self._machines: dict[int, str] = {}
        self.records = root / "records.jsonl"
        self.records.touch()
        self.queues: dict[str, str] = {}
        self.executions: dict[tuple[str, int], str] = {}
        self.clock = SystemClock()
        self.runs = DynamoRunStore(self.ddb, self.tables.jobs, self.clock)
        self.nodes = DynamoNodeStore(self.ddb, self.tables.control)
        self.dispatch_queue = self.sqs.create_queue(QueueName=f"dispatch-{tag}")["QueueUrl"]
        iam = boto3.client("iam", **kw)
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}
        role = iam.create_role(RoleName=f"node-job-{tag}", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        settings = NodeApiSettings(jobs_table=self.tables.jobs, control_table=self.tables.control,
                                   outputs_bucket=self.bucket, checkpoints_bucket=self.bucket, logs_bucket=self.bucket,
                                   agent_role_names=AGENT_ROLE, node_job_role_arn=role,
                                   gang_silence_s=GANG_SILENCE_S, gang_barrier_timeout_s=GANG_BARRIER_S)
        api = build_api(settings, dynamodb=self.ddb, stepfunctions=self.sfn, sts=boto3.client("sts", **kw),
                        clock=self.clock)
        self.credentials: dict[str, LocalCredential] = {}
        self.gateway = Gateway(lambda: api.handle, [], region="us-east-1").start()
        self._stop = threading.Event()
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="fleet-dispatch", daemon=True)
        self._dispatcher.start()

    def close(self) -> None:
        self._stop.set()
        self._dispatcher.join(5)
        self.gateway.stop()

    def state_machine(self, heartbeat_s: int) -> str:
        if heartbeat_s not in self._machines:
            self._machines[heartbeat_s] = self.sfn.create_state_machine(
                name=f"run-{self.tag}-{heartbeat_s}",
                definition=json.dumps(state_machine_definition(self.dispatch_queue, heartbeat_s)),
                roleArn="arn:aws:iam::123456789012:role/sfn",
            )["stateMachineArn"]
        return self._machines[heartbeat_s]

    def _dispatch_loop(self) -> None:
        """What the deployed dispatch_onprem Lambda does for every Run state (see module doc)."""
        while not self._stop.is_set():
            try:
                msgs = self.sqs.receive_message(QueueUrl=self.dispatch_queue, WaitTimeSeconds=1,
                                                MaxNumberOfMessages=10).get("Messages", [])
            except Exception:  # noqa: BLE001 - the server went away at teardown
                return
            for m in msgs:
                self.sqs.delete_message(QueueUrl=self.dispatch_queue, ReceiptHandle=m["ReceiptHandle"])
                dispatch(self.runs, lambda url, body: self.sqs.send_message(QueueUrl=url, MessageBody=body),
                         self.clock, json.loads(m["Body"]))

    # the node API as a node reaches it -----------------------------------------------------------
    def node_credential(self, node: str) -> LocalCredential:
        """``node``'s access key; the gateway maps it to ``node``'s agent session (its IAM principal)."""
        if node not in self.credentials:
            cred = LocalCredential(access_key_id=f"AKNODE{uuid.uuid4().hex[:12].upper()}",
                                   secret_access_key=uuid.uuid4().hex,
                                   principal_arn=agent_session_arn(ACCOUNT, AGENT_ROLE, node))
            self.credentials[node] = cred
            self.gateway.credentials[cred.access_key_id] = cred
        return self.credentials[node]

    def node_env(self, node: str) -> dict[str, str]:
        cred = self.node_credential(node)
        return {**AWS_ENV, "AWS_ACCESS_KEY_ID": cred.access_key_id, "AWS_SECRET_ACCESS_KEY": cred.secret_access_key}

    def node_api(self, node: str) -> NodeApiClient:
        cred = self.node_credential(node)
        return NodeApiClient(self.gateway.url, "us-east-1",
                             credentials=Credentials(cred.access_key_id, cred.secret_access_key))

    def register(self, node: str, gpus: int = 1) -> None:
        """The operator binds ``node`` to the test pool with ``gpus`` slots."""
        self.nodes.register(Registration(node_id=node, pool="onprem-test", site="test", gpus=gpus,
                                         queue_url=self.node_queue(node), registered_by="fleet"))

    # nodes and agents ------------------------------------------------------------------------
    def node_queue(self, node: str) -> str:
        if node not in self.queues:
            self.queues[node] = self.sqs.create_queue(QueueName=f"gpufleet-node-{node}-{self.tag}")["QueueUrl"]
        return self.queues[node]

    def agent(self, node: str, **overrides) -> AgentProcess:
        self.register(node, gpus=int(overrides.get("cpu_slots", 1)))
        return AgentProcess(self, node, overrides)

    def node_item(self, node: str) -> dict | None:
        resp = self.ddb.get_item(TableName=self.tables.control, Key={"pk": {"S": node_pk(node)}, "sk": {"S": "NODE"}},
                                 ConsistentRead=True)
        return unmarshal(resp.get("Item"))

    # jobs ----------------------------------------------------------------------------------------
    def submit(self, job_id: str, spec: dict | None = None, **env_cfg) -> None:
        """A job for the contract runtime (steered by ``env_cfg``), or with an explicit ``spec``."""
        cfg = {"RECORD_FILE": str(self.records), **{k: str(v) for k, v in env_cfg.items()}}
        spec = spec or {"workload": {"kind": "container", "image": "contract-runtime", "command": ["run"], "env": cfg},
                        "resources": {"gpus": 1}}
        self.ddb.put_item(TableName=self.tables.jobs, Item=marshal({
            "pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "tenant": "t", "status": "SCHEDULED",
            "current_epoch": 0, "spec": spec,
        }))

    def job(self, job_id: str) -> dict:
        resp = self.ddb.get_item(TableName=self.tables.jobs, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
                                 ConsistentRead=True)
        return unmarshal(resp["Item"])

    def place(self, job_id: str, node: str, gpu_indices: list[int] | None = None,
              heartbeat_s: int = HEARTBEAT_SECONDS, gang: list[str] | None = None, stage: str = "container") -> int:
        """Scheduler + lifecycle: issue the next epoch and start a Run execution to the node's queue
        (``gang``: the member nodes, ``node`` first; each member gets ``gpu_indices`` on its node)."""
        job = self.job(job_id)
        epoch = issue_epoch(self.ddb, self.tables.jobs, job_id, int(job.get("current_epoch", 0)))
        placement = {"epoch": epoch, "attempt": epoch, "pool": "onprem-test", "node": node,
                     "queue_url": self.node_queue(node), "gpu_indices": gpu_indices or [], "gpu_milli": 1000,
                     "price_per_gpu_hour": 1.0}
        if gang:
            placement["members"] = [{"node": n, "queue_url": self.node_queue(n), "gpu_indices": gpu_indices or []}
                                    for n in gang]
        self.ddb.put_item(TableName=self.tables.jobs, Item=marshal({  # the scheduler's attempt item
            "pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt", "job_id": job_id, "epoch": epoch,
            "state": "placed", "placement": placement}))
        envelope = {
            "job_id": job_id, "attempt": epoch, "epoch": epoch, "stage": stage, "spec": job["spec"],
            "s3": {"bucket_outputs": self.bucket, "bucket_checkpoints": self.bucket, "bucket_logs": self.bucket,
                   "output_prefix": f"jobs/{job_id}/", "checkpoint_prefix": f"jobs/{job_id}/",
                   "log_prefix": f"jobs/{job_id}/attempt-{epoch:04d}/", "inputs": []},
            "placement": placement,
            "tables": {"jobs": self.tables.jobs, "control": self.tables.control},
            "heartbeat_seconds": heartbeat_s,
        }
        arn = self.sfn.start_execution(
            stateMachineArn=self.state_machine(heartbeat_s), name=f"{job_id}-{epoch}",
            input=json.dumps({"job_id": job_id, "run": {"target": "onprem", "queue_url": self.node_queue(node),
                                                        "envelope": envelope}}),
        )["executionArn"]
        self.executions[(job_id, epoch)] = arn
        return epoch

    def cancel(self, job_id: str) -> None:
        self.ddb.update_item(TableName=self.tables.jobs, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
                             UpdateExpression="SET cancel_requested = :t", ExpressionAttributeValues={":t": {"BOOL": True}})

    def execution(self, job_id: str, epoch: int) -> dict:
        return self.sfn.describe_execution(executionArn=self.executions[(job_id, epoch)])

    def wait_execution(self, job_id: str, epoch: int, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            d = self.execution(job_id, epoch)
            if d["status"] != "RUNNING":
                return d
            if time.monotonic() > deadline:
                raise AssertionError(f"execution of {job_id}@{epoch} still running after {timeout}s")
            time.sleep(0.1)

    # worker records --------------------------------------------------------------------------
    def events(self, job_id: str | None = None, event: str | None = None) -> list[dict]:
        out = []
        for line in self.records.read_text().splitlines():
            r = json.loads(line)
            if (job_id is None or r["job"] == job_id) and (event is None or r["event"] == event):
                out.append(r)
        return out

    def wait_event(self, job_id: str, event: str, timeout: float = 60, **match) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.events(job_id, event):
                if all(r.get(k) == v for k, v in match.items()):
                    return r
            time.sleep(0.05)
        raise AssertionError(f"no {event} {match} for {job_id} within {timeout}s")


class AgentProcess:
    """``python -m onprem_agent --config agent.toml`` as a real process with its own state dir."""

    def __init__(self, fleet: Fleet, node: str, overrides: dict) -> None:
        self.fleet = fleet
        self.node = node
        self.dir = fleet.root / f"agent-{node}"
        self.dir.mkdir(exist_ok=True)
        self.settings = {
            "node_id": node, "pool": "onprem-test", "queue_url": fleet.node_queue(node), "region": "us-east-1",
            "endpoint_url": fleet.endpoint, "node_api_url": fleet.gateway.url,
            "jobs_table": fleet.tables.jobs, "control_table": fleet.tables.control,
            "state_dir": str(self.dir / "state"), "cache_dir": str(fleet.root / f"cache-{node}"),
            "cache_max_bytes": 1 << 30, "cpu_slots": 1, "labels": {"site": "test"},
            "runtime_command": [sys.executable, str(CONTRACT_RUNTIME)],
            "poll_wait_s": 1, "prefetch": 1, "visibility_timeout_s": 4, "heartbeat_interval_s": 0.5,
            "node_heartbeat_s": 1.0, "node_ttl_s": 5, "cancel_grace_s": 1.0, "drain_timeout_s": 20.0,
            "metrics_port": 0, "log_level": "INFO",
            **overrides,
        }
        self.config = self.dir / "agent.toml"
        self.config.write_text(tomli_w.dumps({"agent": self.settings}))
        self.log = self.dir / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "AWS_"))}
        env.update(self.fleet.node_env(self.node))  # the node's own credentials (its identity at the node API)
        env["PYTHONPATH"] = str(REPO)
        since = len(self.log_lines()) if self.log.exists() else 0
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "onprem_agent", "--config", str(self.config)],
                                         env=env, cwd=str(REPO), stdout=fh, stderr=subprocess.STDOUT)
        self.wait_log("agent started", since=since)
        return self

    def log_lines(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"msg": line})
        return out

    def wait_log(self, msg: str, timeout: float = 60, since: int = 0, **match) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.log_lines()[since:]:
                if r.get("msg") == msg and all(r.get(k) == v for k, v in match.items()):
                    return r
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent {self.node} exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"agent {self.node} never logged {msg!r}:\n{self.log.read_text()[-3000:]}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 90) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def fleet(moto_endpoint, tmp_path, monkeypatch):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    f = Fleet(moto_endpoint, tmp_path)
    agents: list[AgentProcess] = []
    orig = f.agent

    def tracked(node: str, **overrides) -> AgentProcess:
        a = orig(node, **overrides)
        agents.append(a)
        return a

    f.agent = tracked  # type: ignore[method-assign]
    yield f
    running = [a for a in agents if a.proc is not None and a.proc.poll() is None]
    for a in running:  # drain them all at once, then wait (a second SIGTERM would mean "exit now")
        a.proc.send_signal(signal.SIGTERM)
    for a in running:
        try:
            a.proc.wait(30)
        except subprocess.TimeoutExpired:
            a.proc.kill()
            a.proc.wait(10)
    f.close()


@pytest.fixture(scope="session")
def oci():
    """Tenant containers on this machine (:class:`gpufleet.local.oci_image.LocalOci`), for the real runtime;
    skips where podman cannot run (see ``make tools``)."""
    import shutil

    from gpufleet.local import oci_image

    reason = oci_image.local_oci_unavailable()
    if reason:
        pytest.skip(f"tenant containers unavailable: {reason}")
    local = oci_image.prepare_local()
    yield local
    shutil.rmtree(local.jobs_dir, ignore_errors=True)
