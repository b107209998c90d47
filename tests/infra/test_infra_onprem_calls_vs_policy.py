"""Every AWS call an on-prem node makes is allowed by the synthesized agent policy.

moto does not enforce IAM, so this test records the real boto3 calls (botocore ``before-parameter-build``
hooks: operation, bucket/key/prefix, tags, keys, expressions) of
- the runtime on an on-prem envelope: a ``generate`` run that stages a versioned input, checkpoints and
  logs, then a retry (next epoch) that resumes from the checkpoint pointer (lists the fallbacks);
- the agent's adapters (:mod:`onprem_agent.aws`) and its health check;
and checks each against the agent policy's statements, conditions included, with the small evaluator of
:mod:`iam_matcher` (its scope is stated there). Negative cases show the evaluator can deny.
"""

from __future__ import annotations

import copy
import io
import json

import boto3
import pytest
from iam_matcher import Request, allowed_by, requests_for, resolve
from moto import mock_aws

from gpufleet.envelope import ExitCode
from gpufleet.store.dynamo import marshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.schema import create_tables
from gpufleet.tables import JOB_META, TableNames, job_pk

pytestmark = pytest.mark.xdist_group("cdk-synth")

NODE, REGION, ACCOUNT = "node-7", "us-east-1", "123456789012"
BUCKETS = {"bucket_outputs": "gf-iam-outputs", "bucket_checkpoints": "gf-iam-checkpoints", "bucket_logs": "gf-iam-logs"}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
JOB = "job_iam"


@pytest.fixture(scope="module")
def statements(tpl) -> list[dict]:
    (raw,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in tpl["Resources"].items()
              if k.startswith("OnPremAgentPolicy") and r["Type"] == "AWS::IAM::Policy"]
    names = TableNames()
    arns = {"DataOutputs": f"arn:aws:s3:::{BUCKETS['bucket_outputs']}",
            "DataCheckpoints": f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}",
            "DataLogs": f"arn:aws:s3:::{BUCKETS['bucket_logs']}",
            "DataJobsTable": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names.jobs}",
            "DataControlTable": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names.control}",
            "OrchestrationBus": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/gpufleet"}
    pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
    return resolve(raw, arns, {"aws:PrincipalTag/x509Subject/CN": NODE}, pseudo)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def attach(self, client):
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-parameter-build.{service}", self._record)
        return client

    def _record(self, params, model, **_kw) -> None:
        self.calls.append((model.service_model.service_id.hyphenize(), model.name, copy.deepcopy(params)))

    def requests(self) -> list[Request]:
        return [r for svc, op, p in self.calls for r in requests_for(svc, op, p, REGION, ACCOUNT)]


@pytest.fixture
def world(monkeypatch, tmp_path_factory):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME, save_tiny_wan

    cache = tmp_path_factory.mktemp("iam-cache")
    save_tiny_wan(cache / "models" / TINY_MODEL_NAME)
    with mock_aws():
        ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_tables(ddb, TableNames())
        for b in BUCKETS.values():
            s3.create_bucket(Bucket=b)
        s3.put_bucket_versioning(Bucket=BUCKETS["bucket_outputs"], VersioningConfiguration={"Status": "Enabled"})
        yield ddb, s3, cache


def _envelope(epoch: int, spec: dict) -> dict:
    return {"job_id": JOB, "attempt": epoch, "epoch": epoch, "stage": "generate", "spec": spec,
            "s3": {**BUCKETS, "output_prefix": f"jobs/{JOB}/", "checkpoint_prefix": f"jobs/{JOB}/",
                   "log_prefix": f"jobs/{JOB}/attempt-{epoch:04d}/"},
            "placement": {"pool": "onprem", "node": NODE, "gpu_indices": [0]}, "tables": {"jobs": TableNames().jobs}}


def _run_runtime(rec: Recorder, cache, tmp_path, epoch: int, spec: dict) -> list[dict]:
    from gpufleet.runtime.main import main
    from gpufleet.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(cache), checkpoint_every_steps=2,
                               checkpoint_every_seconds=0, checkpoint_overhead_budget=0, log_flush_s=0,
                               log_chunk_lines=3, torch_threads=1, tiny_generate_side=32, node_id=NODE)
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(_envelope(epoch, spec))], settings=settings,
                s3=rec.attach(boto3.client("s3")), dynamodb=rec.attach(boto3.client("dynamodb")), stdout=out,
                install_signals=False)
    assert code == ExitCode.SUCCEEDED, out.getvalue()[-2000:]
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def _retry(ddb) -> None:
    """What the lifecycle does before a retry: next epoch, back to SCHEDULED; the output is dropped so it runs."""
    issue_epoch(ddb, TableNames().jobs, JOB, 1)
    ddb.update_item(TableName=TableNames().jobs, Key={"pk": {"S": job_pk(JOB)}, "sk": {"S": JOB_META}},
                    UpdateExpression="SET #s = :s REMOVE generated", ExpressionAttributeNames={"#s": "status"},
                    ExpressionAttributeValues={":s": {"S": "SCHEDULED"}})


def _agent_calls(rec: Recorder, tmp_path) -> None:
    from gpufleet.clock import SystemClock
    from gpufleet.errors import GpufleetError
    from onprem_agent.aws import JobReader, NodeQueue, NodeRegistry, TaskTokens
    from onprem_agent.health import check
    from onprem_agent.settings import AgentSettings

    url = boto3.client("sqs").create_queue(QueueName=f"gpufleet-node-{NODE}")["QueueUrl"]
    boto3.client("sqs").send_message(QueueUrl=url, MessageBody="{}")
    sqs, ddb = rec.attach(boto3.client("sqs")), rec.attach(boto3.client("dynamodb"))
    queue = NodeQueue(sqs, url)
    (msg,) = queue.receive(1, 0, 30)
    assert queue.extend(msg.receipt, 60)
    queue.delete(msg.receipt)
    queue.attributes()
    try:  # moto may or may not know the token; the call is what is checked
        TaskTokens(rec.attach(boto3.client("stepfunctions"))).heartbeat("not-a-token")
    except GpufleetError:
        pass
    assert JobReader(ddb, TableNames().jobs).read(JOB).exists
    registry = NodeRegistry(ddb, TableNames().control)
    registry.put({"node_id": NODE, "pool": "onprem", "gpus": 1})
    assert registry.get(NODE)["pool"] == "onprem"
    settings = AgentSettings(node_id=NODE, pool="onprem", queue_url=url, state_dir=tmp_path / "st",
                             cache_dir=tmp_path / "ca")
    report = check(settings, clock=SystemClock(), environ={}, sqs=sqs, dynamodb=ddb)
    assert report.checks["jobs_table"]["ok"] and report.checks["queue"]["ok"]


def test_every_call_of_an_onprem_node_is_allowed_by_the_agent_policy(statements, world, tmp_path):
    ddb, s3, cache = world
    version = s3.put_object(Bucket=BUCKETS["bucket_outputs"], Key=f"jobs/{JOB}/inputs/notes.txt",
                            Body=b"input")["VersionId"]
    spec = {"workload": {"kind": "video.generate", "prompt": "a red fox", "width": 64, "height": 64, "frames": 5,
                         "steps": 6, "seed": 3},
            "data": {"inputs": [f"s3://{BUCKETS['bucket_outputs']}/jobs/{JOB}/inputs/notes.txt?versionId={version}"]}}
    ddb.put_item(TableName=TableNames().jobs, Item=marshal(
        {"pk": job_pk(JOB), "sk": JOB_META, "job_id": JOB, "status": "SCHEDULED", "current_epoch": 1, "spec": spec}))
    rec = Recorder()
    _run_runtime(rec, cache, tmp_path / "e1", 1, spec)
    _retry(ddb)
    events = _run_runtime(rec, cache, tmp_path / "e2", 2, spec)
    assert [e["step"] for e in events if e.get("event") == "resumed"] == [4]
    _agent_calls(rec, tmp_path)

    ops = {(svc, op) for svc, op, _ in rec.calls}
    assert {("s3", "PutObject"), ("s3", "ListObjectsV2"), ("s3", "HeadObject"), ("dynamodb", "TransactWriteItems"),
            ("dynamodb", "UpdateItem"), ("dynamodb", "DescribeTable"), ("sqs", "ReceiveMessage")} <= ops, ops
    reqs = rec.requests()
    assert {"s3:GetObjectVersion", "s3:PutObjectTagging", "dynamodb:ConditionCheckItem"} <= {r.action for r in reqs}
    denied = sorted({f"{r.action} {r.resource} {r.context}" for r in reqs if not allowed_by(statements, r)})
    assert not denied, "denied by the agent policy:\n" + "\n".join(denied)


@pytest.mark.parametrize("req", [
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}/jobs/j/checkpoints/000002-e0001.ckpt"),
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_logs']}/jobs/j/attempt-0001/00000000.log",
            {"s3:RequestObjectTag/gpufleet:node": ["node-8"]}),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}", {"s3:prefix": ["models/"]}),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}", {"s3:prefix": ["jobs/j/"]}),
    Request("s3:GetObject", f"arn:aws:s3:::{BUCKETS['bucket_logs']}/jobs/j/attempt-0001/00000000.log"),
    Request("dynamodb:UpdateItem", f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-jobs",
            {"dynamodb:LeadingKeys": ["JOB#j"], "dynamodb:Attributes": ["pk", "sk", "current_epoch", "output"]}),
    Request("dynamodb:PutItem", f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-control",
            {"dynamodb:LeadingKeys": ["NODE#node-8"]}),
], ids=["untagged-put", "other-node-tag", "list-outside-jobs", "list-outputs", "read-logs", "worker-writes-output",
        "other-node-record"])
def test_the_evaluator_denies_what_the_policy_does_not_grant(statements, req):
    assert allowed_by(statements, req) == []
