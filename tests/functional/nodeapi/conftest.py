"""A moto world for the node API: tables, buckets, two registered nodes, and a Run state that really waits.

The Run state here is ``sqs:sendMessage.waitForTaskToken`` to a control-plane queue the test owns,
whose message is the payload the deployed RunOnPrem state gives the ``dispatch_onprem`` Lambda
(``{"job_id", "token", "run"}``); :meth:`World.start` hands it to the same
:func:`gpufleet.nodeapi.dispatch.dispatch` the Lambda runs. So a token is stored server-side, nodes
receive envelopes without it, and Step Functions (moto executes the state machine) waits until the
node API answers it.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.clock import SystemClock
from gpufleet.nodeapi.dispatch import dispatch
from gpufleet.nodeapi.identity import agent_session_arn
from gpufleet.nodeapi.liveness import Registration
from gpufleet.nodeapi.settings import NodeApiSettings, build_api
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.nodes import DynamoNodeStore
from gpufleet.store.runs import DynamoRunStore
from gpufleet.store.schema import create_tables
from gpufleet.tables import JOB_META, TableNames, attempt_sk, job_pk

for _k, _v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(_k, _v)

REGION = "us-east-1"
ACCOUNT = "123456789012"
AGENT_ROLE = "gpufleet-agent"
NODES = ("node-a", "node-b")
SUPERVISOR_ROLE = "gpufleet-cloud-supervisor"
NODE_API_ARN = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:nodeapi1"


class World:
    def __init__(self) -> None:
        c = {n: boto3.client(n, region_name=REGION) for n in ("dynamodb", "sqs", "stepfunctions", "s3", "iam", "sts")}
        self.c = c
        self.tables = TableNames(jobs="nodeapi-jobs", control="nodeapi-control", ledger="nodeapi-ledger")
        create_tables(c["dynamodb"], self.tables)
        self.buckets = {"checkpoints": "nodeapi-ckpt", "outputs": "nodeapi-out", "logs": "nodeapi-logs"}
        for b in self.buckets.values():
            c["s3"].create_bucket(Bucket=b)
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}
        role = c["iam"].create_role(RoleName="node-job", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        self.supervisor_role = c["iam"].create_role(RoleName=SUPERVISOR_ROLE,
                                                    AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        self.clock = SystemClock()
        self.settings = NodeApiSettings(
            jobs_table=self.tables.jobs, control_table=self.tables.control,
            outputs_bucket=self.buckets["outputs"], checkpoints_bucket=self.buckets["checkpoints"],
            logs_bucket=self.buckets["logs"], agent_role_names=AGENT_ROLE, node_job_role_arn=role,
            supervisor_role_arn=self.supervisor_role, node_api_arn=NODE_API_ARN)
        self.api = build_api(self.settings, dynamodb=c["dynamodb"], stepfunctions=c["stepfunctions"], sts=c["sts"],
                             clock=self.clock)
        self.runs = DynamoRunStore(c["dynamodb"], self.tables.jobs, self.clock)
        self.nodes = DynamoNodeStore(c["dynamodb"], self.tables.control)
        self.queues = {}
        for n in NODES:
            self.queues[n] = c["sqs"].create_queue(QueueName=f"gpufleet-node-{n}")["QueueUrl"]
            self.nodes.register(Registration(node_id=n, pool="onprem-a", site="eu-west", gpu_type="A100", gpus=2,
                                             gpu_memory_gb=80, cpu_milli=32000, memory_mib=256000,
                                             queue_url=self.queues[n], registered_by="test-admin"))
        self.control_queue = c["sqs"].create_queue(QueueName="dispatch")["QueueUrl"]
        definition = {"StartAt": "RunOnPrem", "States": {"RunOnPrem": {
            "Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "HeartbeatSeconds": 60, "TimeoutSeconds": 300,
            "Parameters": {"QueueUrl": self.control_queue,
                           "MessageBody": {"job_id.$": "$.job_id", "token.$": "$$.Task.Token", "run.$": "$.run"}},
            "End": True}}}
        self.machine = c["stepfunctions"].create_state_machine(
            name="run", definition=json.dumps(definition), roleArn=f"arn:aws:iam::{ACCOUNT}:role/sfn")["stateMachineArn"]

    # ---------------------------------------------------------------- jobs and attempts
    def job(self, job_id: str) -> dict:
        return self.runs.job(job_id)

    def attempt(self, job_id: str, epoch: int) -> dict | None:
        return self.runs.attempt(job_id, epoch)

    def place(self, job_id: str, node: str, epoch: int) -> dict:
        """A job at ``epoch`` (SCHEDULED) with an attempt placed on ``node``; returns the run (PrepareRun's output)."""
        spec = {"workload": {"kind": "container", "image": "busybox", "command": ["true"]}, "resources": {"gpus": 1},
                "data": {"inputs": [f"s3://{self.buckets['outputs']}/tenants/t1/in.bin"]}}
        placement = {"epoch": epoch, "attempt": epoch, "target": "onprem", "pool": "onprem-a", "node": node,
                     "queue_url": self.queues[node], "gpu_indices": [0], "gpu_milli": 1000, "price_per_gpu_hour": 1.0}
        ddb = self.c["dynamodb"]
        ddb.put_item(TableName=self.tables.jobs, Item=marshal({
            "pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "tenant": "t1", "status": "SCHEDULED",
            "current_epoch": epoch, "spec": spec, "placement": placement, "placement_token": "secret-placement-token"}))
        ddb.put_item(TableName=self.tables.jobs, Item=marshal({
            "pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt", "job_id": job_id, "epoch": epoch,
            "state": "placed", "placement": placement}))
        envelope = {"job_id": job_id, "attempt": epoch, "epoch": epoch, "stage": "container", "spec": spec,
                    "s3": {"bucket_outputs": self.buckets["outputs"], "bucket_checkpoints": self.buckets["checkpoints"],
                           "bucket_logs": self.buckets["logs"], "output_prefix": f"jobs/{job_id}/",
                           "checkpoint_prefix": f"jobs/{job_id}/", "log_prefix": f"jobs/{job_id}/attempt-{epoch:04d}/",
                           "inputs": []},
                    "placement": placement, "tables": {"jobs": self.tables.jobs}, "heartbeat_seconds": 30}
        return {"target": "onprem", "queue_url": self.queues[node], "envelope": envelope}

    def put_cloud_attempt(self, job_id: str, epoch: int, placement: dict, spec: dict | None = None) -> None:
        """A SCHEDULED job of tenant ``t1`` at ``epoch`` (with ``spec`` if given) and its attempt placed on the cloud
        ``placement`` (what the scheduler commits for a cloud run)."""
        ddb = self.c["dynamodb"]
        meta = {"pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "tenant": "t1", "status": "SCHEDULED",
                "current_epoch": epoch, "placement": placement, **({"spec": spec} if spec is not None else {})}
        ddb.put_item(TableName=self.tables.jobs, Item=marshal(meta))
        ddb.put_item(TableName=self.tables.jobs, Item=marshal({
            "pk": job_pk(job_id), "sk": attempt_sk(epoch), "type": "attempt", "job_id": job_id, "epoch": epoch,
            "state": "placed", "placement": placement}))

    def new_epoch(self, job_id: str, node: str, epoch: int) -> dict:
        """The scheduler placed the next attempt (``epoch``) on ``node``: a newer current epoch."""
        return self.place(job_id, node, epoch)

    def start(self, job_id: str, run: dict) -> str:
        """Start the Run state and dispatch it (what the deployed RunOnPrem + dispatch_onprem do)."""
        arn = self.c["stepfunctions"].start_execution(
            stateMachineArn=self.machine, name=f"{job_id}-{uuid.uuid4().hex[:6]}",
            input=json.dumps({"job_id": job_id, "run": run}))["executionArn"]
        sqs = self.c["sqs"]
        deadline = time.monotonic() + 20
        while True:
            msgs = sqs.receive_message(QueueUrl=self.control_queue, WaitTimeSeconds=1).get("Messages", [])
            for m in msgs:
                sqs.delete_message(QueueUrl=self.control_queue, ReceiptHandle=m["ReceiptHandle"])
                dispatch(self.runs, lambda url, body: sqs.send_message(QueueUrl=url, MessageBody=body), self.clock,
                         json.loads(m["Body"]))
                self._task_submitted(arn)
                return arn
            if time.monotonic() > deadline:
                raise AssertionError("the Run state never dispatched")

    def _task_submitted(self, arn: str, timeout: float = 10) -> None:
        """Wait until moto's execution has recorded the Run task as submitted: it sets up the task's heartbeat
        endpoint only after its service call (the message the test has just read), so a heartbeat sent in between
        is "task-gone" and the task's later answer may be lost — an emulator race AWS does not have (seen once
        under a loaded full suite)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.c["stepfunctions"].get_execution_history(executionArn=arn, reverseOrder=True)["events"]
            if any(e["type"] == "TaskSubmitted" for e in events):
                time.sleep(0.05)  # the endpoint is set up right after the event, in the same thread
                return
            time.sleep(0.02)

    def execution(self, arn: str) -> dict:
        return self.c["stepfunctions"].describe_execution(executionArn=arn)

    def wait_done(self, arn: str, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            d = self.execution(arn)
            if d["status"] != "RUNNING" or time.monotonic() > deadline:
                return d
            time.sleep(0.05)

    def node_messages(self, node: str) -> list[dict]:
        msgs = self.c["sqs"].receive_message(QueueUrl=self.queues[node], MaxNumberOfMessages=10,
                                             WaitTimeSeconds=1).get("Messages", [])
        return [json.loads(m["Body"]) for m in msgs]

    def snapshot(self, job_id: str) -> list[dict]:
        """Every item of the job's partition (job, attempts, events), for nothing-changed checks."""
        resp = self.c["dynamodb"].query(TableName=self.tables.jobs, KeyConditionExpression="pk = :p",
                                        ExpressionAttributeValues={":p": {"S": job_pk(job_id)}}, ConsistentRead=True)
        return [unmarshal(i) for i in resp["Items"]]

    # ---------------------------------------------------------------- the HTTP surface
    def call(self, node: str | None, method: str, path: str, body: dict | None = None, *, arn: str | None = None):
        user = arn if arn is not None else (agent_session_arn(ACCOUNT, AGENT_ROLE, node) if node else None)
        event = {"httpMethod": method, "path": path, "body": json.dumps(body) if body is not None else None,
                 "requestContext": {"identity": {"userArn": user}}}
        resp = self.api.handle(event)
        return resp["statusCode"], json.loads(resp["body"])

    def op(self, node: str, job_id: str, epoch: int, op: str, body: dict | None = None, **kw):
        return self.call(node, "POST", f"/v1/node/jobs/{job_id}/attempts/{epoch}/{op}", body or {}, **kw)


@pytest.fixture(scope="module")
def world():
    with fast_mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield World()
