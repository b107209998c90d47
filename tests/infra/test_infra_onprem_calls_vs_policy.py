"""Every call an on-prem node makes is allowed by the synthesized policies, and nothing else a node might try.

moto does not enforce IAM, so this test records the real calls (botocore ``before-parameter-build`` hooks,
and the node API requests the loopback gateway verifies) of
- the runtime on an on-prem envelope: a ``generate`` run that stages a versioned input, checkpoints and
  logs, then a retry (next epoch) that resumes from the checkpoint pointer (lists the fallbacks). Its job
  writes are node API calls; its object calls are made with the attempt's credentials, so they are checked
  against the node-job role's policy *and* the session policy the node API vends for that job;
- the runtime's ``generate`` run loading a published model from the deployment's models root
  (``GPUFLEET_MODEL_S3_ROOT``: its manifest and files, into an empty node cache), checked the same way;
- the agent's adapters (:mod:`onprem_agent.aws`: its queue, the attempt reports, the liveness report) and
  its health check;
and checks the node's own calls (SQS, ``execute-api:Invoke``) against the agent policy's statements,
conditions included, with the small evaluator of :mod:`iam_matcher` (its scope is stated there). The node
makes no DynamoDB, Step Functions or S3 call with its own identity. The hostile list below (a node completing
a task token, reading or writing job items, listing buckets, writing another job's objects with its vended
credentials) is denied.
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
from gpufleet.tables import JOB_META, TableNames, attempt_sk, job_pk

pytestmark = pytest.mark.xdist_group("cdk-synth")

NODE, REGION, ACCOUNT = "node-7", "us-east-1", "123456789012"
BUCKETS = {"bucket_outputs": "gf-iam-outputs", "bucket_checkpoints": "gf-iam-checkpoints", "bucket_logs": "gf-iam-logs"}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
JOB = "job_iam"
#: the deployment's published models (the template's models bucket, ``models/`` in it)
MODELS_BUCKET = "gf-iam-models"
MODELS_ROOT = f"s3://{MODELS_BUCKET}/models/"
AGENT_ROLE = "gpufleet-agent"
API_ID = "nodeapi01"
STATE_MACHINE = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:gpufleet-workflow"


def _policy(tpl, prefix: str) -> list[dict]:
    (raw,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in tpl["Resources"].items()
              if k.startswith(prefix) and r["Type"] == "AWS::IAM::Policy"]
    (api,) = [k for k, r in tpl["Resources"].items() if r["Type"] == "AWS::ApiGateway::RestApi"]
    raw = json.loads(json.dumps(raw).replace(json.dumps({"Ref": api}), json.dumps(API_ID)))
    names = TableNames()
    arns = {"DataOutputs": f"arn:aws:s3:::{BUCKETS['bucket_outputs']}",
            "DataCheckpoints": f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}",
            "DataLogs": f"arn:aws:s3:::{BUCKETS['bucket_logs']}",
            "DataModels": f"arn:aws:s3:::{MODELS_BUCKET}",
            "DataJobsTable": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names.jobs}",
            "DataControlTable": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{names.control}",
            "OrchestrationBus": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/gpufleet"}
    pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
    return resolve(raw, arns, {"aws:PrincipalTag/x509Subject/CN": NODE}, pseudo)


@pytest.fixture(scope="module")
def statements(tpl) -> list[dict]:
    """The agent role's policy (what a node's own identity may do)."""
    return _policy(tpl, "OnPremAgentPolicy")


@pytest.fixture(scope="module")
def job_role(tpl) -> list[dict]:
    """The node-job role's policy (the bound of every vended attempt credential)."""
    return _policy(tpl, "OnPremNodeJobPolicy")


def session(job_id: str, models: str = MODELS_ROOT) -> list[dict]:
    """The session policy the node API vends for an attempt of ``job_id`` (with the deployment's models root, as the
    template sets the node API's ``GPUFLEET_MODEL_S3_ROOT``)."""
    from gpufleet.nodeapi.scope import session_policy

    return session_policy(job_id, checkpoints=BUCKETS["bucket_checkpoints"], outputs=BUCKETS["bucket_outputs"],
                          logs=BUCKETS["bucket_logs"], inputs=[], models=models)["Statement"]


def invoke(method: str, path: str) -> Request:
    return Request("execute-api:Invoke", f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{API_ID}/v1/{method}{path}")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def attach(self, client):
        service = client.meta.service_model.service_id.hyphenize()
        client.meta.events.register(f"before-parameter-build.{service}", self._record)
        return client

    def _record(self, params, model, **_kw) -> None:
        self.calls.append((model.service_model.service_id.hyphenize(), model.name, copy.deepcopy(params)))

    def requests(self, services: tuple[str, ...] | None = None) -> list[Request]:
        return [r for svc, op, p in self.calls if services is None or svc in services
                for r in requests_for(svc, op, p, REGION, ACCOUNT)]


@pytest.fixture
def world(monkeypatch, tmp_path_factory):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    from gpufleet.clock import SystemClock
    from gpufleet.devstack.gateway import Gateway, LocalCredential
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME, save_tiny_wan
    from gpufleet.nodeapi.identity import agent_session_arn
    from gpufleet.nodeapi.liveness import Registration
    from gpufleet.nodeapi.settings import NodeApiSettings, build_api
    from gpufleet.store.nodes import DynamoNodeStore

    cache = tmp_path_factory.mktemp("iam-cache")
    save_tiny_wan(cache / "models" / TINY_MODEL_NAME)
    with mock_aws():
        ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_tables(ddb, TableNames())
        for b in (*BUCKETS.values(), MODELS_BUCKET):
            s3.create_bucket(Bucket=b)
        s3.put_bucket_versioning(Bucket=BUCKETS["bucket_outputs"], VersioningConfiguration={"Status": "Enabled"})
        names = TableNames()
        DynamoNodeStore(ddb, names.control).register(Registration(node_id=NODE, pool="onprem", gpus=1))
        role = boto3.client("iam").create_role(RoleName="node-job", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        api = build_api(NodeApiSettings(jobs_table=names.jobs, control_table=names.control,
                                        outputs_bucket=BUCKETS["bucket_outputs"],
                                        checkpoints_bucket=BUCKETS["bucket_checkpoints"],
                                        logs_bucket=BUCKETS["bucket_logs"], agent_role_names=AGENT_ROLE,
                                        node_job_role_arn=role, model_s3_root=MODELS_ROOT),
                        dynamodb=boto3.client("dynamodb"), stepfunctions=boto3.client("stepfunctions"),
                        sts=boto3.client("sts"), clock=SystemClock())
        invoked: list[Request] = []

        def handle(event, context=None):
            invoked.append(invoke(event["httpMethod"], event["path"]))
            return api.handle(event, context)

        import os

        # the node's credentials as botocore finds them in the environment (mock_aws sets its own)
        node_key = LocalCredential(access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                                   secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                                   session_token=os.environ.get("AWS_SESSION_TOKEN"),
                                   principal_arn=agent_session_arn(ACCOUNT, AGENT_ROLE, NODE))
        with Gateway(lambda: handle, [node_key], region=REGION) as gateway:
            yield ddb, s3, cache, gateway, invoked


def _envelope(epoch: int, spec: dict) -> dict:
    return {"job_id": JOB, "attempt": epoch, "epoch": epoch, "stage": "generate", "spec": spec,
            "s3": {**BUCKETS, "output_prefix": f"jobs/{JOB}/", "checkpoint_prefix": f"jobs/{JOB}/",
                   "log_prefix": f"jobs/{JOB}/attempt-{epoch:04d}/"},
            "placement": {"pool": "onprem", "node": NODE, "gpu_indices": [0]}, "tables": {"jobs": TableNames().jobs}}


def _attempt(ddb, epoch: int) -> None:
    """The scheduler's attempt item: the placement names this node."""
    ddb.put_item(TableName=TableNames().jobs, Item=marshal(
        {"pk": job_pk(JOB), "sk": attempt_sk(epoch), "type": "attempt", "job_id": JOB, "epoch": epoch,
         "placement": {"epoch": epoch, "pool": "onprem", "node": NODE, "gpu_indices": [0]}}))


def _run_runtime(rec: Recorder, cache, tmp_path, epoch: int, spec: dict, api_url: str, **extra) -> list[dict]:
    from gpufleet.runtime.main import main
    from gpufleet.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(cache), checkpoint_every_steps=2,
                               checkpoint_every_seconds=0, checkpoint_overhead_budget=0, log_flush_s=0,
                               log_chunk_lines=3, torch_threads=1, tiny_generate_side=32, node_id=NODE,
                               node_api_url=api_url, async_checkpoints=False,  # deterministic resume step
                               **extra)
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(_envelope(epoch, spec))], settings=settings,
                s3=rec.attach(boto3.client("s3")), dynamodb=rec.attach(boto3.client("dynamodb")), stdout=out,
                install_signals=False)
    assert code == ExitCode.SUCCEEDED, out.getvalue()[-2000:]
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def _retry(ddb) -> None:
    """What the lifecycle does before a retry: next epoch, back to SCHEDULED; the output is dropped so it runs."""
    issue_epoch(ddb, TableNames().jobs, JOB, 1)
    _attempt(ddb, 2)
    ddb.update_item(TableName=TableNames().jobs, Key={"pk": {"S": job_pk(JOB)}, "sk": {"S": JOB_META}},
                    UpdateExpression="SET #s = :s REMOVE generated", ExpressionAttributeNames={"#s": "status"},
                    ExpressionAttributeValues={":s": {"S": "SCHEDULED"}})


def _agent_calls(rec: Recorder, tmp_path, api_url: str) -> None:
    from gpufleet.clock import SystemClock
    from gpufleet.errors import TaskGone
    from gpufleet.store.nodeapi import NodeApiClient
    from gpufleet.store.queues import signals_url
    from onprem_agent.aws import AttemptReports, NodeQueue, NodeRegistry, SignalQueue
    from onprem_agent.health import check
    from onprem_agent.settings import AgentSettings

    url = boto3.client("sqs").create_queue(QueueName=f"gpufleet-node-{NODE}")["QueueUrl"]
    boto3.client("sqs").send_message(QueueUrl=url, MessageBody="{}")
    sqs = rec.attach(boto3.client("sqs"))
    queue = NodeQueue(sqs, url)
    (msg,) = queue.receive(1, 0, 30)
    assert queue.extend(msg.receipt, 60)
    queue.delete(msg.receipt)
    queue.attributes()
    signals = boto3.client("sqs").create_queue(QueueName=f"gpufleet-node-{NODE}_signals")["QueueUrl"]
    assert signals == signals_url(url)
    boto3.client("sqs").send_message(QueueUrl=signals, MessageBody=json.dumps({"type": "cancel", "job_id": JOB,
                                                                               "epoch": 2}))
    assert SignalQueue(sqs, signals).receive(0) == [(JOB, 2)]
    api = NodeApiClient(api_url, REGION)
    reports = AttemptReports(api)
    for call in (lambda: reports.heartbeat(JOB, 2), lambda: reports.fail(JOB, 2, "PREEMPTED", "drain")):
        with pytest.raises(TaskGone):  # the attempt was never dispatched here: no task waits; the call is checked
            call()
    api.attempt(JOB, 2, "credentials")  # what the runtime's scoped S3 client asks for
    registry = NodeRegistry(api)
    registry.put({"gpus": [{"index": 0, "milli_free": 1000}], "draining": False}, ttl_s=30)
    assert registry.get()["pool"] == "onprem"
    settings = AgentSettings(node_id=NODE, pool="onprem", queue_url=url, state_dir=tmp_path / "st",
                             cache_dir=tmp_path / "ca", node_api_url=api_url)
    report = check(settings, clock=SystemClock(), environ={}, sqs=sqs, node_api=api)
    assert report.checks["node_api"]["ok"] and report.checks["queue"]["ok"]


def test_every_call_of_an_onprem_node_is_allowed_by_the_agent_policy(statements, job_role, world, tmp_path):
    ddb, s3, cache, gateway, invoked = world
    version = s3.put_object(Bucket=BUCKETS["bucket_outputs"], Key=f"jobs/{JOB}/inputs/notes.txt",
                            Body=b"input")["VersionId"]
    spec = {"workload": {"kind": "video.generate", "prompt": "a red fox", "width": 64, "height": 64, "frames": 5,
                         "steps": 6, "seed": 3},
            "data": {"inputs": [f"s3://{BUCKETS['bucket_outputs']}/jobs/{JOB}/inputs/notes.txt?versionId={version}"]}}
    ddb.put_item(TableName=TableNames().jobs, Item=marshal(
        {"pk": job_pk(JOB), "sk": JOB_META, "job_id": JOB, "status": "SCHEDULED", "current_epoch": 1, "spec": spec}))
    _attempt(ddb, 1)
    rec = Recorder()
    _run_runtime(rec, cache, tmp_path / "e1", 1, spec, gateway.url)
    _retry(ddb)
    events = _run_runtime(rec, cache, tmp_path / "e2", 2, spec, gateway.url)
    assert [e["step"] for e in events if e.get("event") == "resumed"] == [4]
    _agent_calls(rec, tmp_path, gateway.url)

    ops = {(svc, op) for svc, op, _ in rec.calls}
    assert {("s3", "PutObject"), ("s3", "ListObjectsV2"), ("s3", "HeadObject"), ("sqs", "ReceiveMessage")} <= ops, ops
    # the node's own identity: its queue and the node API, nothing else (no DynamoDB, no Step Functions)
    assert not {svc for svc, _op, _p in rec.calls} - {"s3", "sqs"}, ops
    paths = {r.resource.rsplit("/v1/node/", 1)[-1].rsplit("/", 1)[-1] for r in invoked}
    assert {"view", "progress", "running", "checkpoint", "generated", "staging", "event", "heartbeat",
            "fail", "credentials"} <= paths, paths
    own = rec.requests(("sqs",)) + invoked
    denied = sorted({f"{r.action} {r.resource} {r.context}" for r in own if not allowed_by(statements, r)})
    assert not denied, "denied by the agent policy:\n" + "\n".join(denied)
    # the runtime's object calls, with the attempt's credentials: the node-job role and the job's session policy
    objects = rec.requests(("s3",))
    assert {"s3:GetObjectVersion", "s3:PutObjectTagging", "s3:ListBucket"} <= {r.action for r in objects}
    denied = sorted({f"{r.action} {r.resource} {r.context}" for r in objects
                     if not (allowed_by(job_role, r) and allowed_by(session(JOB), r))})
    assert not denied, "denied to the attempt's credentials:\n" + "\n".join(denied)


def test_a_published_models_reads_are_allowed_to_the_attempts_credentials(job_role, world, tmp_path):
    """A generate job whose model is published under the deployment's models root: the runtime reads its manifest
    and files (an empty node cache) with the attempt's credentials, which the node-job role and the job's session
    policy allow; a session without the models root would refuse them (what AWS did before models had a home)."""
    from gpufleet.models.loader import publish_model
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME
    from gpufleet.store.objectstore import ObjectStore

    ddb, s3, cache, gateway, _invoked = world
    # the operator publishes with their own credentials (not the node's: not recorded)
    digest = publish_model(cache / "models" / TINY_MODEL_NAME, ObjectStore(s3), MODELS_ROOT, TINY_MODEL_NAME)
    spec = {"workload": {"kind": "video.generate", "prompt": "a red fox", "width": 64, "height": 64, "frames": 5,
                         "steps": 2, "seed": 3, "model": TINY_MODEL_NAME}}
    ddb.put_item(TableName=TableNames().jobs, Item=marshal(
        {"pk": job_pk(JOB), "sk": JOB_META, "job_id": JOB, "status": "SCHEDULED", "current_epoch": 1, "spec": spec}))
    _attempt(ddb, 1)
    rec = Recorder()
    node_cache = tmp_path / "node-cache"
    _run_runtime(rec, node_cache, tmp_path / "e1", 1, spec, gateway.url, model_s3_root=MODELS_ROOT)
    assert (node_cache / "models" / "sha256" / digest / "model_index.json").is_file()  # loaded from S3

    objects = rec.requests(("s3",))
    models = [r for r in objects if r.resource.startswith(f"arn:aws:s3:::{MODELS_BUCKET}/")]
    assert f"arn:aws:s3:::{MODELS_BUCKET}/models/{TINY_MODEL_NAME}/manifest.json" in {r.resource for r in models}
    assert any(r.resource.endswith("/model_index.json") for r in models), models
    assert {r.action for r in models} == {"s3:GetObject"}
    denied = sorted({f"{r.action} {r.resource} {r.context}" for r in objects
                     if not (allowed_by(job_role, r) and allowed_by(session(JOB), r))})
    assert not denied, "denied to the attempt's credentials:\n" + "\n".join(denied)
    assert not [r for r in models if allowed_by(session(JOB, models=""), r)]


JOBS_TABLE = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-jobs"
#: what a compromised node might try with its own identity: every one is denied by the agent policy
HOSTILE_FROM_A_NODE = [
    Request("states:SendTaskSuccess", "*"),
    Request("states:SendTaskSuccess", STATE_MACHINE),
    Request("states:SendTaskHeartbeat", STATE_MACHINE),
    Request("states:SendTaskFailure", STATE_MACHINE),
    Request("dynamodb:GetItem", JOBS_TABLE, {"dynamodb:LeadingKeys": ["JOB#j"]}),
    Request("dynamodb:PutItem", JOBS_TABLE, {"dynamodb:LeadingKeys": ["JOB#j"], "dynamodb:Attributes": ["pk", "sk"]}),
    Request("dynamodb:UpdateItem", JOBS_TABLE,
            {"dynamodb:LeadingKeys": ["JOB#j"], "dynamodb:Attributes": ["pk", "sk", "status", "current_epoch"]}),
    Request("dynamodb:PutItem", f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-control",
            {"dynamodb:LeadingKeys": [f"NODE#{NODE}"]}),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}", {"s3:prefix": ["jobs/"]}),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}", {"s3:prefix": [""]}),
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}/jobs/other-job/output/x.bin",
            {"s3:RequestObjectTag/gpufleet:node": [NODE]}),
    Request("s3:GetObject", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}/jobs/other-job/output/x.bin"),
    invoke("POST", "/v1/jobs"),  # the tenants' API is not a node's
    invoke("POST", "/v1/nodes"),  # nor is registration
]
#: what the attempt's vended credentials (job ``JOB``) might be used for beyond their job: denied
HOSTILE_WITH_ATTEMPT_CREDENTIALS = [
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}/jobs/other-job/checkpoints/1.ckpt"),
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}/jobs/other-job/output/x.bin"),
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_logs']}/jobs/other-job/attempt-0001/0.log"),
    Request("s3:GetObject", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}/jobs/other-job/output/x.bin"),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_checkpoints']}", {"s3:prefix": ["jobs/"]}),
    Request("s3:ListBucket", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}", {"s3:prefix": [f"jobs/{JOB}/"]}),
    Request("s3:PutObject", f"arn:aws:s3:::{BUCKETS['bucket_outputs']}/tenants/t1/in.bin"),
    # the published models are read only: no write, replace, delete or listing
    Request("s3:PutObject", f"arn:aws:s3:::{MODELS_BUCKET}/models/wan-tiny/manifest.json"),
    Request("s3:PutObjectTagging", f"arn:aws:s3:::{MODELS_BUCKET}/models/wan-tiny/manifest.json"),
    Request("s3:DeleteObject", f"arn:aws:s3:::{MODELS_BUCKET}/models/wan-tiny/manifest.json"),
    Request("s3:DeleteObjectVersion", f"arn:aws:s3:::{MODELS_BUCKET}/models/wan-tiny/manifest.json"),
    Request("s3:ListBucket", f"arn:aws:s3:::{MODELS_BUCKET}", {"s3:prefix": ["models/"]}),
    Request("s3:GetObject", f"arn:aws:s3:::{MODELS_BUCKET}/other/x.bin"),
]


@pytest.mark.parametrize("req", HOSTILE_FROM_A_NODE, ids=lambda r: f"{r.action}:{r.resource.rsplit(':', 1)[-1]}")
def test_a_node_is_denied_every_hostile_call(statements, req):
    assert allowed_by(statements, req) == []


@pytest.mark.parametrize("req", HOSTILE_WITH_ATTEMPT_CREDENTIALS, ids=lambda r: f"{r.action}:{r.resource}")
def test_attempt_credentials_are_denied_beyond_their_job(job_role, req):
    assert not (allowed_by(job_role, req) and allowed_by(session(JOB), req))


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
    Request("sqs:ReceiveMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-8"),
    Request("sqs:ReceiveMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-8_signals"),
    Request("sqs:SendMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-{NODE}_signals"),
    Request("sqs:SendMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-{NODE}"),
], ids=["untagged-put", "other-node-tag", "list-outside-jobs", "list-outputs", "read-logs", "worker-writes-output",
        "other-node-record", "other-node-queue", "other-node-signals", "nudge-itself", "send-itself-work"])
def test_the_evaluator_denies_what_the_policy_does_not_grant(statements, req):
    assert allowed_by(statements, req) == []
