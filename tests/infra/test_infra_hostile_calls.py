"""Hostile calls against the synthesized policies: what a compromised function would try is DENIED.

For each control-plane function's role (and the state machine's), the calls an attacker holding that
role would make first (read another table, scan the control table, rewrite a tenant mapping, overwrite
a job's META item, read webhook secrets or the cursor key, list or read outputs, submit to an arbitrary
Batch queue, answer task tokens, start executions, ...) are evaluated with :mod:`iam_matcher`; each
must be denied unless the function's own code makes that very call (then it is not hostile for it and
the calls-vs-policy survey covers it). The two Batch job roles are probed the same way: the GPU job
definition's role (generate runs a diffusion model on tenants' prompts; container runs tenants' images) must
not read the C2PA signing key or touch what only finalize does, and the finalize role must not reach
checkpoints. Pure template evaluation: no deployment.
"""

from __future__ import annotations

import pytest
from iam_matcher import Request, Template, allowed_by

from infra.config import ALL_FUNCTIONS

pytestmark = pytest.mark.xdist_group("cdk-synth")

REGION, ACCOUNT = "us-east-1", "123456789012"
JOB = "JOB#job_00000000000000000000000000"
FUNCTIONS = [f.key for f in ALL_FUNCTIONS]


@pytest.fixture(scope="module")
def t(tpl) -> Template:
    return Template(tpl, REGION, ACCOUNT)


def _lid(t: Template, kind: str, contains: str) -> str:
    (lid,) = [k for k, r in t.resources.items() if r["Type"] == kind and contains in k]
    return lid


def _table(t: Template, logical: str) -> str:
    return t.attribute(_lid(t, "AWS::DynamoDB::Table", f"Data{logical.capitalize()}Table"), "Arn")


def _bucket(t: Template, name: str) -> str:
    return t.attribute(_lid(t, "AWS::S3::Bucket", f"Data{name}"), "Arn")


def _ddb(t, action, table, pk, attrs=(), index=None, returns=None) -> Request:
    ctx = {"dynamodb:LeadingKeys": [pk]} if pk else {}
    if attrs:
        ctx["dynamodb:Attributes"] = sorted(attrs)
    if action in ("GetItem", "BatchGetItem", "Query"):
        ctx["dynamodb:Select"] = ["SPECIFIC_ATTRIBUTES" if attrs else "ALL_ATTRIBUTES"]
    if returns:
        ctx["dynamodb:ReturnValues"] = [returns]
    return Request(f"dynamodb:{action}", _table(t, table) + (f"/index/{index}" if index else ""), ctx)


def _event(detail_type: str, source: str = "gpufleet") -> dict[str, list[str]]:
    return {"events:source": [source], "events:detail-type": [detail_type]}


def hostile(t: Template) -> dict[str, tuple[Request, set[str]]]:
    """name → (request, functions whose own code makes exactly this call: not hostile for them)."""
    machine = t.ref(_lid(t, "AWS::StepFunctions::StateMachine", "Workflow"))
    webhook_queue = t.attribute(_lid(t, "AWS::SQS::Queue", "OrchestrationWebhookQueue"), "Arn")
    bus = t.attribute(_lid(t, "AWS::Events::EventBus", "OrchestrationBus"), "Arn")
    secret = t.ref(_lid(t, "AWS::SecretsManager::Secret", "CursorSecret"))
    other_queue = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/attacker-queue"
    other_def = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/attacker-def:1"
    tenant_def = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/gpufleet-tenant-0123456789abcdef-beef"
    job_fields = ("pk", "sk", "status", "spec", "tenant", "owner_path", "current_epoch")
    return {
        # listings go through index partitions: no function scans any table
        "scan control table": (_ddb(t, "Scan", "control", None), set()),
        "query the control table's owner index": (_ddb(t, "Query", "control", "OWNER#t1", index="gsi1"), set()),
        "list principals through an index": (_ddb(t, "Query", "control", "PRINCIPAL#x", index="gsi2"), set()),
        # operators' reports on prompt decisions hold the reported prompt: the administration API's alone
        "read a safety report (a prompt)": (_ddb(t, "GetItem", "control", "SAFETYREPORT#job_x"), {"admin_api"}),
        "write a safety report": (_ddb(t, "UpdateItem", "control", "SAFETYREPORT#job_x"), {"admin_api"}),
        "list safety reports": (_ddb(t, "Query", "control", "DIR#SAFETYREPORTS", index="gsi2"), {"admin_api"}),
        # the tenant item's webhook secrets are KMS-sealed; the API (the tenant's own) and the administration API read it
        "read a tenant item (webhook secret)": (_ddb(t, "GetItem", "control", "TENANT#t1"),
                                                {"webhook", "api", "admin_api"}),
        "batch-read tenant items whole": (_ddb(t, "BatchGetItem", "control", "TENANT#t1"), set()),
        "batch-read a tenant's webhook secret": (
            _ddb(t, "BatchGetItem", "control", "TENANT#t1", ("pk", "sk", "webhook_secret")), set()),
        "scan jobs table": (_ddb(t, "Scan", "jobs", None), set()),
        "scan ledger": (_ddb(t, "Scan", "ledger", None), set()),
        "read another tenant's ledger entry": (_ddb(t, "GetItem", "ledger", JOB), {"bill"}),
        "write a ledger entry": (_ddb(t, "PutItem", "ledger", JOB), {"bill"}),
        "delete a job's META item": (_ddb(t, "DeleteItem", "jobs", JOB), set()),
        "batch-write any table": (_ddb(t, "BatchWriteItem", "jobs", JOB), set()),
        "put a job META item (forge a job)": (
            _ddb(t, "PutItem", "jobs", JOB, job_fields), {"api"}),
        # a job's identity and content are fixed at submission: denied to every role, those that update job items
        # included (infra.grants.IMMUTABLE_JOB_ATTRIBUTES)
        "update a job's status and spec": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "status", "spec")), set()),
        "re-own a job (its tenant and owner)": (
            _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "tenant", "team", "user", "owner_path")), set()),
        "move a job into another tenant's list": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "gsi1pk")), set()),
        "raise a job's priority": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "status", "priority")), set()),
        # the model content a generate job runs is pinned from the model catalog at submission
        "repin a job's model (run other weights)": (
            _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "model_hash")), set()),
        # a job's result: every role that updates job items is bound to the attributes its code writes; only Publish
        # both moves a job to SUCCEEDED and names its output (a BLOCKED job's output is removed), and the API's put
        # is bound to a new job's attributes
        "mark a job SUCCEEDED with an output of its choosing": (
            _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "status", "output")), {"publish"}),
        "forge a finished job item (its output and final)": (
            _ddb(t, "PutItem", "jobs", JOB, ("pk", "sk", "type", "job_id", "tenant", "status", "spec", "output",
                                             "final")), set()),
        "rewrite a job's output": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "output")),
                                   {"collect_outputs", "finalize", "publish"}),
        "set a job's execution ARN": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "execution_arn")), {"outbox"}),
        "rewrite a job's billing": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "billing")),
                                    {"bill"}),
        # ``final`` is what Bill charges by: the steps that end a job write it, the API's recovery removes it
        "forge a job's final outcome": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "final")),
                                        {"api", "classify_failure", "mark_terminal", "publish"}),
        "rewrite a job's placement (where it runs)": (
            _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "placement")), {"scheduler"}),
        "swap a job's placement token": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "placement_token")),
                                         {"api", "await_placement", "classify_failure"}),
        "rewrite a job's frozen safety settings": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "safety")),
                                                   {"check_prompt"}),
        "reset a job's failure budget": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "system_failures")),
                                         {"api", "classify_failure"}),
        "ask a job's worker to stop (preemption)": (
            _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "preempt_requested")), {"scheduler"}),
        "clear a job's cancel request": (_ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "cancel_requested")),
                                         {"api", "await_placement", "check_prompt"}),
        "read a principal (tenant mapping)": (_ddb(t, "GetItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"),
                                              # registration: is it an admin; the lookup: whose tenant is asking
                                              {"api", "register_node", "admin_api", "provenance_lookup"}),
        "rewrite a tenant mapping": (_ddb(t, "PutItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"), set()),
        "delete a principal": (_ddb(t, "DeleteItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"), {"admin_api"}),
        "raise a quota": (_ddb(t, "UpdateItem", "control", "QUOTA#t1"),
                          {"scheduler", "complete_run", "classify_failure", "mark_terminal", "admin_api"}),
        # the scheduler: a commit lane short of quota reads what its level has left (gpufleet.store.escrow.reserve)
        "read a quota": (_ddb(t, "GetItem", "control", "QUOTA#t1"), {"admin_api", "scheduler"}),
        "drain a commit lane's quota escrow": (_ddb(t, "UpdateItem", "control", "ESCROW#0of1.0"), {"scheduler"}),
        "take over a scheduler shard's lease": (_ddb(t, "PutItem", "control", "LEASE#scheduler#1of4"), {"scheduler"}),
        # an operator's registration, and the node API's liveness item built from it
        "write a node record (join a pool)": (_ddb(t, "PutItem", "control", "NODE#node-7"), {"register_node", "node_api"}),
        "delete an allocation": (_ddb(t, "DeleteItem", "control", "ALLOC#node-7"),
                                 {"scheduler", "complete_run", "classify_failure", "mark_terminal"}),
        "write an idempotency record": (_ddb(t, "PutItem", "control", "IDEMP#t1#k"), {"api"}),
        "rotate a tenant's webhook secret": (_ddb(t, "UpdateItem", "control", "TENANT#t1",
                                                  ("pk", "sk", "webhook_keys", "webhook_key_id")),
                                             {"webhook", "api"}),  # sealed secrets; the tenant rotates them
        # the model catalog decides which models jobs may name and the content they run: the administration API's
        # alone (submission reads an entry's content hash; the runtime runs nothing else)
        "register a model (choose what jobs run)": (
            _ddb(t, "UpdateItem", "control", "MODEL#wan-2.1", ("pk", "sk", "content_hash", "source")), {"admin_api"}),
        "put a model catalog entry": (_ddb(t, "PutItem", "control", "MODEL#wan-2.1"), set()),
        "deregister a model": (_ddb(t, "DeleteItem", "control", "MODEL#wan-2.1"), {"admin_api"}),
        "read a model catalog entry whole": (_ddb(t, "GetItem", "control", "MODEL#wan-2.1"), {"admin_api"}),
        "list the model catalog": (_ddb(t, "Query", "control", "DIR#MODELS", index="gsi2"), {"admin_api"}),
        # published models: operators write them with their own credentials; a registration reads the manifest
        "read a published model's manifest": (
            Request("s3:GetObject", _bucket(t, "Models") + "/models/wan-2.1/manifest.json"), {"admin_api"}),
        "read a published model's files": (
            Request("s3:GetObject", _bucket(t, "Models") + "/models/wan-2.1/transformer/weights.safetensors"), set()),
        "publish a model manifest": (
            Request("s3:PutObject", _bucket(t, "Models") + "/models/wan-2.1/manifest.json"), set()),
        "list the published models": (Request("s3:ListBucket", _bucket(t, "Models"), {"s3:prefix": ["models/"]}),
                                      set()),
        "overwrite a tenant's defaults": (_ddb(t, "UpdateItem", "control", "TENANT#t1", ("pk", "sk", "placement_policy")),
                                          {"admin_api"}),
        # tenants' webhook endpoints: only the API (the tenant's own) writes them; the fan-out reads them
        "register a webhook endpoint": (_ddb(t, "PutItem", "control", "WHEP#t1"), {"api"}),
        "delete a webhook endpoint": (_ddb(t, "DeleteItem", "control", "WHEP#t1"), {"api"}),
        "list a tenant's webhook endpoints": (_ddb(t, "Query", "control", "WHEP#t1"),
                                              {"api", "notify", "webhook_events"}),
        # the sender's delivery claims share the job's partition: its attribute set keeps them from being a job item
        "claim a delivery as a job item": (_ddb(t, "UpdateItem", "jobs", "JOB#job_x",
                                                ("pk", "sk", "status", "claimed_by")), set()),
        "list the outputs bucket": (Request("s3:ListBucket", _bucket(t, "Outputs"), {"s3:prefix": [""]}), set()),
        "list all jobs' outputs": (Request("s3:ListBucket", _bucket(t, "Outputs"), {"s3:prefix": ["jobs/"]}), set()),
        # FinalizeLambda writes the video (and checks it exists before returning a recorded result)
        # the API and the lookup presign links with their roles
        "read a job's video": (Request("s3:GetObject", _bucket(t, "Outputs") + "/jobs/job_x/video.mp4"),
                               {"api", "finalize", "provenance_lookup"}),
        "overwrite a job's video": (Request("s3:PutObject", _bucket(t, "Outputs") + "/jobs/job_x/video.mp4"),
                                    {"finalize"}),
        "delete a job's video": (Request("s3:DeleteObject", _bucket(t, "Outputs") + "/jobs/job_x/video.mp4"), set()),
        "read a checkpoint": (Request("s3:GetObject", _bucket(t, "Checkpoints") + "/jobs/job_x/checkpoints/1.ckpt"),
                              set()),
        "read logs": (Request("s3:GetObject", _bucket(t, "Logs") + "/jobs/job_x/attempt-0001/0.log"), {"api"}),
        "read the API cursor key": (Request("secretsmanager:GetSecretValue", secret), {"api"}),
        # the C2PA signing key: only the finalize stage's roles (test_infra_signing_secret.py): of the functions,
        # FinalizeLambda alone
        "read the C2PA signing key": (Request("secretsmanager:GetSecretValue",
                                              t.ref(_lid(t, "AWS::SecretsManager::Secret", "SigningSecret"))),
                                      {"finalize"}),
        # the watermark keys: the finalize stage's roles (they embed) and the provenance lookup's function (it
        # detects); not the API function, the most exposed one
        "read the watermark keys": (Request("secretsmanager:GetSecretValue",
                                            t.ref(_lid(t, "AWS::SecretsManager::Secret", "WatermarkSecret"))),
                                    {"finalize", "provenance_lookup"}),
        "submit to an arbitrary Batch queue": (Request("batch:SubmitJob", other_queue), set()),
        # RunCloudContainer's dispatch registers and submits only <prefix>-tenant-* definitions, passing only the
        # tenant execution role (image pull, logs)
        "submit with an arbitrary job definition": (Request("batch:SubmitJob", other_def), set()),
        "register an arbitrary job definition": (Request("batch:RegisterJobDefinition", other_def), set()),
        "register a tenant image's definition": (Request("batch:RegisterJobDefinition", tenant_def),
                                                 {"dispatch_cloud"}),
        "pass the run job role to a definition": (Request("iam:PassRole", t.attribute(
            _lid(t, "AWS::IAM::Role", "ComputeRunJobRole"), "Arn")), set()),
        "pass an arbitrary role": (Request("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/attacker"), set()),
        # the node API answers RunOnPrem's tokens for the node it checked
        "place a job (SendTaskSuccess)": (Request("states:SendTaskSuccess", machine), {"scheduler", "node_api"}),
        # the scheduler fails the placement token of a job whose deadline passed (EXPIRED)
        "fail a job's task (SendTaskFailure)": (Request("states:SendTaskFailure", machine),
                                                {"api", "node_api", "scheduler"}),
        "heartbeat a task": (Request("states:SendTaskHeartbeat", machine), {"node_api"}),
        "start an execution": (Request("states:StartExecution", machine), {"outbox"}),
        "stop an execution": (Request("states:StopExecution", machine.replace(":stateMachine:", ":execution:") + ":j"),
                              set()),
        "queue a forged webhook": (Request("sqs:SendMessage", webhook_queue), {"notify", "webhook_events"}),
        "put an event on the bus": (Request("events:PutEvents", bus, _event("JobPending")),
                                    {"await_placement", "complete_run", "classify_failure"}),
        # the node API announces a usable node (NodeReady) and nothing else: no forged job or capacity events
        "announce a node on the bus": (Request("events:PutEvents", bus, _event("NodeReady")),
                                       {"await_placement", "complete_run", "classify_failure", "node_api"}),
        "put an event from another source": (Request("events:PutEvents", bus, _event("NodeReady", "aws.ec2")),
                                             {"await_placement", "complete_run", "classify_failure"}),
        "create a queue": (Request("sqs:CreateQueue", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-evil"),
                           {"register_node"}),
        "read a node's queue": (Request("sqs:ReceiveMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-7"),
                                set()),
        # a cancel nudges the node's signal queue (no authority: the node API's answer decides); only RunOnPrem's
        # dispatch may put work on a node's queue
        "send a node work (its queue)": (Request("sqs:SendMessage", f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-7"),
                                         {"dispatch_onprem"}),
        "nudge a node (its signal queue)": (Request("sqs:SendMessage",
                                                    f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-7_signals"),
                                            {"api"}),  # dispatch_onprem's node-queue grant is denied here
        "read a node's signals": (Request("sqs:ReceiveMessage",
                                          f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-node-node-7_signals"), set()),
        "terminate any Batch job": (Request("batch:TerminateJob", f"arn:aws:batch:{REGION}:{ACCOUNT}:job/x"), {"api"}),
    }


#: CheckPrompt runs an ML stack on untrusted prompts: it may write nothing but its job's safety decision.
CHECK_PROMPT = {
    "overwrite a job's META item with job fields": lambda t: _ddb(t, "PutItem", "jobs", JOB,
                                                                  ("pk", "sk", "status", "spec", "tenant")),
    "mark a job SUCCEEDED": lambda t: _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "status", "output")),
    "write a job's placement token": lambda t: _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "placement_token")),
    "read a principal": lambda t: _ddb(t, "GetItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"),
    "read an idempotency record": lambda t: _ddb(t, "GetItem", "control", "IDEMP#t1#k"),
    "read a node record": lambda t: _ddb(t, "GetItem", "control", "NODE#node-7"),
    "write the tenant's safety profile": lambda t: _ddb(t, "PutItem", "control", "TENANT#t1"),
    "write the tenant's safety profile (its partition)": lambda t: _ddb(t, "PutItem", "control", "SAFETY#t1"),
    "read a tenant item": lambda t: _ddb(t, "GetItem", "control", "TENANT#t1"),
}


#: The node API acts for semi-trusted nodes: it reads only what it checks of a job and its attempt, never the
#: spec (prompts, container env) or a pending job's placement token, and its writes return only what they set.
NODE_API = {
    "read a job item whole": lambda t: _ddb(t, "GetItem", "jobs", JOB),
    "read a job's spec": lambda t: _ddb(t, "GetItem", "jobs", JOB, ("pk", "sk", "spec")),
    "read a pending job's placement token": lambda t: _ddb(t, "GetItem", "jobs", JOB, ("pk", "sk", "placement_token")),
    "read a job's tenant and webhook": lambda t: _ddb(t, "GetItem", "jobs", JOB, ("pk", "sk", "tenant", "spec")),
    "write progress and read the item back whole": lambda t: _ddb(
        t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "progress"), returns="ALL_NEW"),
    "write progress and read the old item whole": lambda t: _ddb(
        t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "progress"), returns="ALL_OLD"),
    "query a job's partition": lambda t: _ddb(t, "Query", "jobs", JOB),
    "read a tenant item": lambda t: _ddb(t, "GetItem", "control", "TENANT#t1"),
    "read a principal": lambda t: _ddb(t, "GetItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"),
}


@pytest.mark.parametrize("name", sorted(NODE_API))
def test_the_node_api_reads_only_what_it_checks(tpl, t, name):
    assert allowed_by(t.role_statements(_role(tpl, "node_api")), NODE_API[name](t)) == [], name


def test_the_node_api_may_read_what_it_checks(tpl, t):
    # the counterpart: its own projected reads and partial-return writes are allowed (the survey records them)
    statements = t.role_statements(_role(tpl, "node_api"))
    assert allowed_by(statements, _ddb(t, "GetItem", "jobs", JOB, ("pk", "sk", "current_epoch", "status")))
    assert allowed_by(statements, _ddb(t, "GetItem", "jobs", JOB, ("pk", "sk", "placement", "run_token", "inputs")))
    assert allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "progress"),
                                       returns="UPDATED_NEW"))
    # a cloud supervisor's token exchange: the attempt's token hash read, its claim written
    assert allowed_by(statements, _ddb(t, "GetItem", "jobs", JOB, ("pk", "placement", "inputs",
                                                                   "supervisor_token_sha256",
                                                                   "supervisor_token_claimed_at")))
    assert allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "supervisor_token_claimed_at",
                                                                      "supervisor_token_sha256"),
                                       returns="UPDATED_NEW"))


def _role(tpl: dict, key: str) -> str:
    (fn,) = [r for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == key]
    return fn["Properties"]["Role"]["Fn::GetAtt"][0]


def _cases():
    return [(key, name) for key in FUNCTIONS for name in _HOSTILE_NAMES]


_HOSTILE_NAMES = [
    "scan control table", "query the control table's owner index", "list principals through an index",
    "read a safety report (a prompt)", "write a safety report", "list safety reports",
    "read a tenant item (webhook secret)", "batch-read tenant items whole", "batch-read a tenant's webhook secret",
    "scan jobs table", "scan ledger", "read another tenant's ledger entry", "write a ledger entry",
    "delete a job's META item", "batch-write any table", "put a job META item (forge a job)",
    "update a job's status and spec", "re-own a job (its tenant and owner)", "move a job into another tenant's list",
    "raise a job's priority", "repin a job's model (run other weights)",
    "mark a job SUCCEEDED with an output of its choosing", "set a job's execution ARN",
    "forge a finished job item (its output and final)", "rewrite a job's output", "rewrite a job's billing",
    "forge a job's final outcome", "rewrite a job's placement (where it runs)", "swap a job's placement token",
    "rewrite a job's frozen safety settings", "reset a job's failure budget", "ask a job's worker to stop (preemption)",
    "clear a job's cancel request",
    "read a principal (tenant mapping)", "rewrite a tenant mapping",
    "delete a principal", "raise a quota", "read a quota", "drain a commit lane's quota escrow",
    "take over a scheduler shard's lease", "write a node record (join a pool)",
    "delete an allocation", "write an idempotency record", "rotate a tenant's webhook secret",
    "register a model (choose what jobs run)", "put a model catalog entry", "deregister a model",
    "read a model catalog entry whole", "list the model catalog", "read a published model's manifest",
    "read a published model's files", "publish a model manifest", "list the published models",
    "overwrite a tenant's defaults", "register a webhook endpoint", "delete a webhook endpoint",
    "list a tenant's webhook endpoints", "claim a delivery as a job item",
    "list the outputs bucket", "list all jobs' outputs", "read a job's video", "overwrite a job's video",
    "delete a job's video", "read a checkpoint", "read logs", "read the API cursor key", "read the C2PA signing key",
    "read the watermark keys", "submit to an arbitrary Batch queue", "submit with an arbitrary job definition",
    "register an arbitrary job definition", "register a tenant image's definition",
    "pass the run job role to a definition", "pass an arbitrary role", "place a job (SendTaskSuccess)", "fail a job's task (SendTaskFailure)",
    "heartbeat a task", "start an execution", "stop an execution", "queue a forged webhook",
    "put an event on the bus", "announce a node on the bus", "put an event from another source", "create a queue", "read a node's queue", "terminate any Batch job",
    "send a node work (its queue)", "nudge a node (its signal queue)", "read a node's signals",
]


def test_the_case_list_is_complete(t):
    assert sorted(_HOSTILE_NAMES) == sorted(hostile(t))


@pytest.mark.parametrize(("key", "name"), _cases())
def test_a_compromised_function_is_denied(tpl, t, key, name):
    request, own = hostile(t)[name]
    if key in own:
        pytest.skip(f"{key}'s own code makes this call (covered by the calls-vs-policy survey)")
    assert allowed_by(t.role_statements(_role(tpl, key)), request) == [], f"{key} may: {name}"


def _names_jobs_table(t: Template, resources) -> bool:
    jobs = _table(t, "jobs")
    return any(r == jobs or r == "*" for r in (resources if isinstance(resources, list) else [resources]))


@pytest.mark.parametrize("key", FUNCTIONS)
def test_every_write_of_job_items_is_bound_to_attributes(tpl, t, key):
    """No function may put or update job items at large: every Allow of PutItem/UpdateItem on the jobs table names
    the attributes the function's code writes (``ForAllValues:StringEquals dynamodb:Attributes``); the job movers'
    sets are in infra.grants (AWAIT_PLACEMENT_ATTRIBUTES, ..., API_JOB_ATTRIBUTES, JOB_CREATE_ATTRIBUTES)."""
    unbound = []
    for s in t.role_statements(_role(tpl, key)):
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        writes = [a for a in actions if a in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:*")]
        if s["Effect"] != "Allow" or not writes or not _names_jobs_table(t, s["Resource"]):
            continue
        if "dynamodb:Attributes" not in s.get("Condition", {}).get("ForAllValues:StringEquals", {}):
            unbound.append(f"{writes} {s.get('Condition')}")
    assert not unbound, f"{key} writes job items at large:\n" + "\n".join(unbound)


@pytest.mark.parametrize("name", sorted(CHECK_PROMPT))
def test_check_prompt_writes_nothing_but_its_safety_decision(tpl, t, name):
    assert allowed_by(t.role_statements(_role(tpl, "check_prompt")), CHECK_PROMPT[name](t)) == [], name


def test_the_administration_api_stores_reads_and_lists_safety_reports(tpl, t):
    statements = t.role_statements(_role(tpl, "admin_api"))
    for request in (_ddb(t, "GetItem", "control", "SAFETYREPORT#job_x"),
                    _ddb(t, "UpdateItem", "control", "SAFETYREPORT#job_x"),
                    _ddb(t, "Query", "control", "DIR#SAFETYREPORTS", index="gsi2")):
        assert allowed_by(statements, request) != [], request


def test_the_administration_api_keeps_the_model_catalog_and_reads_published_manifests_only(tpl, t):
    statements = t.role_statements(_role(tpl, "admin_api"))
    models = _bucket(t, "Models")
    for request in (_ddb(t, "GetItem", "control", "MODEL#wan-2.1"),
                    _ddb(t, "UpdateItem", "control", "MODEL#wan-2.1", ("pk", "sk", "content_hash", "source")),
                    _ddb(t, "DeleteItem", "control", "MODEL#wan-2.1"),
                    _ddb(t, "Query", "control", "DIR#MODELS", index="gsi2"),
                    Request("s3:GetObject", models + "/models/wan-2.1/manifest.json")):
        assert allowed_by(statements, request) != [], request
    for request in (Request("s3:GetObject", models + "/models/wan-2.1/model_index.json"),
                    Request("s3:GetObject", models + "/manifest.json"),
                    Request("s3:GetObject", models + "/elsewhere/x/manifest.json"),
                    Request("s3:PutObject", models + "/models/wan-2.1/manifest.json"),
                    Request("s3:ListBucket", models, {"s3:prefix": ["models/"]})):
        assert allowed_by(statements, request) == [], request


def test_check_prompt_cannot_read_a_tenants_webhook_secret(tpl, t):
    # the webhook secret sits on TENANT#<t>/TENANT; the safety profile CheckPrompt reads has its own
    # partition (SAFETY#<t>/SAFETY), so the grant names that prefix and the tenant item is out of reach
    statements = t.role_statements(_role(tpl, "check_prompt"))
    assert allowed_by(statements, _ddb(t, "GetItem", "control", "TENANT#t1")) == []
    assert allowed_by(statements, _ddb(t, "GetItem", "control", "SAFETY#t1")) != []


@pytest.mark.parametrize("resource", ["job-queue/attacker-queue", "job-definition/attacker-def:1",
                                      "job-definition/gpufleet-gpu:99"])
def test_the_workflow_submits_only_to_the_platforms_queues_and_definitions(tpl, t, resource):
    role = tpl["Resources"][_lid(t, "AWS::StepFunctions::StateMachine", "Workflow")]["Properties"]["RoleArn"]
    statements = t.role_statements(role["Fn::GetAtt"][0])
    assert allowed_by(statements, Request("batch:SubmitJob", f"arn:aws:batch:{REGION}:{ACCOUNT}:{resource}")) == []
    for lid, r in t.resources.items():
        if r["Type"] in ("AWS::Batch::JobQueue", "AWS::Batch::JobDefinition"):
            assert allowed_by(statements, Request("batch:SubmitJob", t.ref(lid))), lid


@pytest.mark.parametrize(("key", "parts"), [("api", ("DIR#NODES", "DIR#USAGE", "DIR#ALLOCATIONS")),
                                             ("scheduler", ("DIR#NODES", "DIR#USAGE", "DIR#ALLOCATIONS", "DIR#QUOTAS"))])
def test_directory_listings_name_the_index_and_its_partitions(tpl, t, key, parts):
    # the pools view and the scheduler's snapshot list the control table through its directory index
    # (gsi2) instead of a Scan; the grant names that index and only the partitions each reads (the API's
    # operator diagnosis lists the allocations, never the quota nodes)
    statements = t.role_statements(_role(tpl, key))
    for part in ("DIR#NODES", "DIR#USAGE", "DIR#ALLOCATIONS", "DIR#QUOTAS"):
        allowed = allowed_by(statements, _ddb(t, "Query", "control", part, index="gsi2"))
        assert bool(allowed) == (part in parts), (key, part)
    assert allowed_by(statements, _ddb(t, "Scan", "control", None)) == []


def test_the_scheduler_reads_a_tenants_placement_policy_only(tpl, t):
    statements = t.role_statements(_role(tpl, "scheduler"))
    assert allowed_by(statements, _ddb(t, "BatchGetItem", "control", "TENANT#t1", ("pk", "sk", "placement_policy")))
    for attrs in ((), ("pk", "sk", "webhook_secret"), ("pk", "sk", "placement_policy", "webhook_secret")):
        assert allowed_by(statements, _ddb(t, "BatchGetItem", "control", "TENANT#t1", attrs)) == [], attrs


def _batch_role(t: Template, definition: str) -> str:
    """The job role of the Batch job definition named ``definition``."""
    (props,) = [r["Properties"] for r in t.resources.values()
                if r["Type"] == "AWS::Batch::JobDefinition" and r["Properties"]["JobDefinitionName"] == definition]
    return props["ContainerProperties"]["JobRoleArn"]["Fn::GetAtt"][0]


def _signing_key(t: Template) -> Request:
    return Request("secretsmanager:GetSecretValue", t.ref(_lid(t, "AWS::SecretsManager::Secret", "SigningSecret")))


RAW_OUTPUT = "/jobs/job_x/generated/e0001.npz"

#: what a compromised generate or container attempt (the GPU definition's role) would try first
BATCH_RUN = {
    "read the C2PA signing key": _signing_key,
    "read the watermark keys (forge or erase a watermark)": lambda t: Request(
        "secretsmanager:GetSecretValue", t.ref(_lid(t, "AWS::SecretsManager::Secret", "WatermarkSecret"))),
    "read the API cursor key": lambda t: Request("secretsmanager:GetSecretValue",
                                                 t.ref(_lid(t, "AWS::SecretsManager::Secret", "CursorSecret"))),
    "write quarantined output": lambda t: Request("s3:PutObject", _bucket(t, "Outputs") + "/quarantine" + RAW_OUTPUT),
    "delete a job's raw generated output": lambda t: Request("s3:DeleteObject", _bucket(t, "Outputs") + RAW_OUTPUT),
    "delete a version of it": lambda t: Request("s3:DeleteObjectVersion", _bucket(t, "Outputs") + RAW_OUTPUT),
    "delete a job's video": lambda t: Request("s3:DeleteObject", _bucket(t, "Outputs") + "/jobs/job_x/video.mp4"),
    "list all jobs' outputs": lambda t: Request("s3:ListBucket", _bucket(t, "Outputs"), {"s3:prefix": ["jobs/"]}),
    "read a tenant item (webhook secret)": lambda t: _ddb(t, "GetItem", "control", "TENANT#t1"),
    "read a principal": lambda t: _ddb(t, "GetItem", "control", "PRINCIPAL#arn:aws:iam::1:user/x"),
    "write a ledger entry": lambda t: _ddb(t, "PutItem", "ledger", JOB),
    "delete a job's META item": lambda t: _ddb(t, "DeleteItem", "jobs", JOB),
    "scan jobs table": lambda t: _ddb(t, "Scan", "jobs", None),
}

#: what a compromised finalize stage (its Batch job or FinalizeLambda) would try beyond its own calls
BATCH_FINALIZE = {
    "mark a job SUCCEEDED": lambda t: _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "status", "output")),
    "rewrite a job's spec": lambda t: _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "spec")),
    "rewrite a job's placement": lambda t: _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch", "placement")),
    "read the API cursor key": BATCH_RUN["read the API cursor key"],
    "read a checkpoint": lambda t: Request("s3:GetObject", _bucket(t, "Checkpoints") + "/jobs/job_x/checkpoints/1.ckpt"),
    "overwrite a checkpoint": lambda t: Request("s3:PutObject",
                                                _bucket(t, "Checkpoints") + "/jobs/job_x/checkpoints/1.ckpt"),
    "read logs": lambda t: Request("s3:GetObject", _bucket(t, "Logs") + "/jobs/job_x/attempt-0001/0.log"),
    "delete a job's video": BATCH_RUN["delete a job's video"],
    "list all jobs' outputs": BATCH_RUN["list all jobs' outputs"],
    "read a tenant item (webhook secret)": BATCH_RUN["read a tenant item (webhook secret)"],
    "write a ledger entry": BATCH_RUN["write a ledger entry"],
    "delete a job's META item": BATCH_RUN["delete a job's META item"],
    "scan jobs table": BATCH_RUN["scan jobs table"],
}


@pytest.mark.parametrize("name", sorted(BATCH_RUN))
def test_a_compromised_generate_or_container_job_is_denied(t, name):
    assert allowed_by(t.role_statements(_batch_role(t, "gpufleet-gpu")), BATCH_RUN[name](t)) == [], name


#: the hostile writes of job items (the function cases above) that no run attempt's code makes
RUN_JOB_DENIED_WRITES = [
    "put a job META item (forge a job)", "update a job's status and spec", "re-own a job (its tenant and owner)",
    "move a job into another tenant's list", "raise a job's priority", "repin a job's model (run other weights)",
    "mark a job SUCCEEDED with an output of its choosing", "set a job's execution ARN",
    "forge a finished job item (its output and final)", "rewrite a job's output", "rewrite a job's billing",
    "forge a job's final outcome", "rewrite a job's placement (where it runs)", "swap a job's placement token",
    "rewrite a job's frozen safety settings", "reset a job's failure budget",
    "ask a job's worker to stop (preemption)", "clear a job's cancel request", "claim a delivery as a job item",
]


@pytest.mark.parametrize("name", RUN_JOB_DENIED_WRITES)
def test_a_compromised_generate_or_container_job_writes_only_its_worker_attributes(t, name):
    """The GPU job definitions' role (a cloud run attempt: the runtime on tenants' prompts, beside tenant containers'
    supervisors) writes its progress, heartbeats, pointers, staging, phases, crash and RUNNING move only
    (infra.grants.RUN_JOB_ATTRIBUTES): it cannot finish, bill, re-place or re-own its job, or any other."""
    request, _ = hostile(t)[name]
    assert allowed_by(t.role_statements(_batch_role(t, "gpufleet-gpu")), request) == [], name


def test_a_run_attempt_may_write_what_its_runtime_writes(t):
    """The counterpart: each of the runtime's own writes (gpufleet.store.jobitem) is allowed to the GPU role."""
    statements = t.role_statements(_batch_role(t, "gpufleet-gpu"))
    for attrs in (("pk", "sk", "current_epoch", "progress", "heartbeat_at"), ("pk", "sk", "current_epoch", "checkpoint"),
                  ("pk", "sk", "current_epoch", "generated"), ("pk", "sk", "current_epoch", "phases"),
                  ("pk", "sk", "current_epoch", "crash"), ("pk", "sk", "current_epoch", "batch_node_3"),
                  ("pk", "sk", "current_epoch", "status", "updated_at", "running_since", "gsi3pk", "gsi3sk")):
        assert allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, attrs)), attrs
    assert allowed_by(statements, _ddb(t, "PutItem", "jobs", JOB, ("pk", "sk", "type", "job_id", "ts", "kind",
                                                                   "detail")))
    assert not allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "current_epoch",
                                                                          "batch_nodes_x", "output")))


def _finalize_role(tpl: dict, t: Template, where: str) -> str:
    """The finalize stage's role: the CPU Batch job definition's (``batch``) or FinalizeLambda's (``lambda``)."""
    return _batch_role(t, "gpufleet-cpu") if where == "batch" else _role(tpl, "finalize")


@pytest.mark.parametrize("where", ["batch", "lambda"])
@pytest.mark.parametrize("name", sorted(BATCH_FINALIZE))
def test_a_compromised_finalize_job_is_denied(tpl, t, name, where):
    assert allowed_by(t.role_statements(_finalize_role(tpl, t, where)), BATCH_FINALIZE[name](t)) == [], name


@pytest.mark.parametrize("where", ["batch", "lambda"])
def test_the_finalize_stage_may_write_its_verdict_output_heartbeats_and_crash(tpl, t, where):
    """The counterpart of the attribute list: what the stage writes is allowed on either role."""
    statements = t.role_statements(_finalize_role(tpl, t, where))
    for attrs in (("pk", "sk", "current_epoch", "moderation", "output"), ("pk", "sk", "current_epoch", "heartbeat_at"),
                  ("pk", "sk", "current_epoch", "progress", "heartbeat_at")):
        assert allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, attrs)), attrs
    assert allowed_by(statements, _ddb(t, "ConditionCheckItem", "jobs", JOB, ("pk", "sk", "current_epoch")))
    assert allowed_by(statements, _ddb(t, "UpdateItem", "jobs", JOB, ("pk", "sk", "crash")))
    assert allowed_by(statements, _ddb(t, "GetItem", "jobs", JOB))  # the job's spec, for the delivery size


def test_the_signing_key_is_the_finalize_roles_alone(tpl, t):
    """The counterpart: the finalize roles' grants read it, and the secret's resource policy denies every other
    principal, the generate/container role included (identity grants alone are not the whole story)."""
    finalize, run, warm = _batch_role(t, "gpufleet-cpu"), _batch_role(t, "gpufleet-gpu"), _role(tpl, "finalize")
    assert len({finalize, run, warm}) == 3
    assert allowed_by(t.role_statements(finalize), _signing_key(t))
    assert allowed_by(t.role_statements(warm), _signing_key(t))
    secret = _lid(t, "AWS::SecretsManager::Secret", "SigningSecret")
    (policy,) = [r["Properties"]["ResourcePolicy"] for r in t.resources.values()
                 if r["Type"] == "AWS::SecretsManager::ResourcePolicy" and r["Properties"]["SecretId"] == {"Ref": secret}]
    (deny,) = policy["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"]["ArnNotEquals"]["aws:PrincipalArn"] == [
        {"Fn::GetAtt": [finalize, "Arn"]}, {"Fn::GetAtt": [warm, "Arn"]}]


def test_the_cloud_dispatch_submits_tenant_definitions_to_the_gpu_queues_only(tpl, t):
    """RunCloudContainer's dispatch: its own calls are allowed (the survey records them); the finalize queue, the
    platform's own definitions (whose job roles reach job items and objects) and any other role are not."""
    statements = t.role_statements(_role(tpl, "dispatch_cloud"))
    tenant_def = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/gpufleet-tenant-0123456789abcdef-beef:3"
    tenant_role = t.attribute(_lid(t, "AWS::IAM::Role", "ComputeTenantExecutionRole"), "Arn")
    for request in (Request("batch:SubmitJob", tenant_def), Request("batch:TagResource", tenant_def),
                    Request("iam:PassRole", tenant_role), Request("batch:DescribeJobDefinitions", "*")):
        assert allowed_by(statements, request), request
    for lid, r in t.resources.items():
        if r["Type"] == "AWS::Batch::JobQueue":
            assert bool(allowed_by(statements, Request("batch:SubmitJob", t.ref(lid)))) == ("Gpu" in lid), lid
        if r["Type"] == "AWS::Batch::JobDefinition":  # the platform's definitions run under its job roles
            assert allowed_by(statements, Request("batch:SubmitJob", t.ref(lid))) == [], lid
        if r["Type"] == "AWS::IAM::Role" and lid != _lid(t, "AWS::IAM::Role", "ComputeTenantExecutionRole"):
            assert allowed_by(statements, Request("iam:PassRole", t.attribute(lid, "Arn"))) == [], lid


def test_a_tenant_listing_reads_the_catalog_projected_only(tpl, t):
    """``GET /v1/models``: the API's role may list the model catalog through the directory index projected to what the
    listing shows (gpufleet.store.model_catalog.LIST_ATTRIBUTES), never whole (who registered each entry)."""
    from gpufleet.store.model_catalog import LIST_ATTRIBUTES

    statements = t.role_statements(_role(tpl, "api"))
    assert allowed_by(statements, _ddb(t, "Query", "control", "DIR#MODELS", LIST_ATTRIBUTES, index="gsi2"))
    assert not allowed_by(statements, _ddb(t, "Query", "control", "DIR#MODELS", index="gsi2"))
    assert not allowed_by(statements, _ddb(t, "Query", "control", "DIR#MODELS", (*LIST_ATTRIBUTES, "updated_by"),
                                           index="gsi2"))
