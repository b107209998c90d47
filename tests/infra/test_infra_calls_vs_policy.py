"""Each control-plane function's role allows exactly the AWS calls its code makes, nothing ``*`` on data.

The calls are derived, not listed: :mod:`control_plane_survey` deploys the synthesized template into moto
and runs jobs through the functions' entry points, recording every boto3 call per function (and the
runtime's calls inside Batch jobs, by the job definition each ran under, checked against that definition's job
role: the GPU definition's role allows exactly what generate and container attempts call, the CPU (finalize)
definition's exactly what finalize calls, the C2PA signing key included). Each recorded call is turned into the
requests IAM authorises (:func:`iam_matcher.requests_for`, conditions included) and evaluated against the
synthesized policies of that function's role. Conversely, every (statement, action) a role holds on a
table, bucket, queue, bus, secret or state machine must have been used by a recorded call, unless it is
listed in :data:`UNEXERCISED` with the code path that needs it.
"""

from __future__ import annotations

import re

import pytest
from control_plane_survey import BATCH_FINALIZE, BATCH_KEYS, BATCH_RUN, CONTAINER_ONLY, CONTAINER_ONLY_CALLS
from iam_matcher import Request, Template, allowed_by, requests_for

from infra.config import ALL_FUNCTIONS

pytestmark = [pytest.mark.xdist_group("cdk-synth"), pytest.mark.slow]

REGION, ACCOUNT = "us-east-1", "123456789012"

#: Actions a role holds for the Lambda service itself (event sources, tracing), not for the handler.
SERVICE_SIDE = {
    "xray:PutTraceSegments", "xray:PutTelemetryRecords",
    "dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams",
    "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl",
    "sqs:ChangeMessageVisibility",  # the SQS event source; the sender also backs off with it
    "sqs:SendMessage",  # an event source's on-failure destination (outbox, webhook-events DLQs)
    "secretsmanager:DescribeSecret",
}

#: (function, action, resource pattern): granted for a code path the survey does not drive, and why.
UNEXERCISED = [
    ("api", "dynamodb:DeleteItem", "*:table/gpufleet-control",
     "idempotency: a submit that fails before it records its response drops its in-flight record"),
    ("api", "s3:GetObjectVersion", "arn:aws:s3:::gpufleet-outputs/jobs/*",
     "the output link is presigned with this role; a versioned link is a GetObjectVersion"),
    ("api", "s3:GetObject", "arn:aws:s3:::gpufleet-outputs/jobs/*", "the presigned output link (no call here)"),
    ("provenance_lookup", "s3:GetObject", "arn:aws:s3:::gpufleet-outputs/jobs/*",
     "a match's manifest (and, to its own tenant, video) link is presigned with this role (no call here)"),
    ("bill", "dynamodb:GetItem", "*:table/gpufleet-ledger", "a retried Bill reads the entry it wrote"),
    ("register_node", "sqs:SetQueueAttributes", "*", "re-registering a node updates its queue's redrive policy"),
    ("register_node", "sqs:TagQueue", "*", "node queues are tagged with their node"),
    ("scheduler", "dynamodb:UpdateItem", "*:table/gpufleet-control", "preemption books node allocations"),
    ("scheduler", "dynamodb:GetItem", "*:table/gpufleet-control",
     "a commit lane short of quota reads what the level has left (gpufleet.store.escrow.reserve; "
     "tests/functional/scheduler/test_sched_shards_store.py)"),
    ("scheduler", "dynamodb:GetItem", "*:table/gpufleet-jobs",
     "a placement whose workflow no longer waits is released (the attempt item is read)"),
    ("webhook", "dynamodb:UpdateItem", "*:table/gpufleet-control",
     "the tenant's webhook secret is created on first delivery (a conditional update)"),
    ("mark_terminal", "dynamodb:UpdateItem", "*:table/gpufleet-control",
     "a workflow failure after placement releases the attempt's allocation and quota"),
    ("mark_terminal", "dynamodb:DeleteItem", "*:table/gpufleet-control", "same: the allocation item"),
    ("mark_terminal", "s3:GetObjectTagging", "*", "tags the checkpoints of a job that has some"),
    ("mark_terminal", "s3:PutObjectTagging", "*", "same"),
    ("classify_failure", "s3:GetObjectTagging", "*", "tags the checkpoints of a failed job that has some"),
    ("classify_failure", "s3:PutObjectTagging", "*", "same"),
    (BATCH_RUN, "dynamodb:ConditionCheckItem", "*", "fenced writes made inside a transaction"),
    (BATCH_FINALIZE, "dynamodb:ConditionCheckItem", "*", "a crashed finalize records its crash on the attempt item "
     "(a transaction with the epoch check)"),
    (BATCH_RUN, "s3:GetObject", "*", "a resumed attempt restores its checkpoint; declared inputs are staged"),
    (BATCH_RUN, "dynamodb:PutItem", "*",
     "the SCHEDULED -> RUNNING move's timeline event: generate makes it on a helper thread (runtime.generate's "
     "Overlapped), which the survey does not attribute, and the container stage of a cloud gang's nodes (the gang "
     "definition shares this role; cloud container jobs now run beside a supervisor with no role)"),
    ("node_api", "dynamodb:ConditionCheckItem", "*",
     "a node's staging report and timeline events go in a transaction with the epoch check (inputs, a resume)"),
    (BATCH_RUN, "s3:GetObjectVersion", "*", "inputs that name a version"),
    (BATCH_RUN, "s3:ListBucket", "*", "a resumed attempt lists the job's fallback checkpoints"),
    # the survey's blocked clip and crashed finalize run in FinalizeLambda ("finalize"); the Batch job's role holds the
    # same grants (infra/orchestration.py, one loop over both roles) for larger clips
    (BATCH_FINALIZE, "s3:PutObject", "*/quarantine/jobs/*", "a blocked clip over FinalizeLambda's bound"),
    (BATCH_FINALIZE, "s3:DeleteObject", "*/jobs/*/generated/*", "same: the blocked raw output leaves jobs/"),
    ("finalize", "dynamodb:ConditionCheckItem", "*", "a crashed finalize records its crash on the attempt item "
     "(a transaction with the epoch check)"),
    ("finalize", "s3:DeleteObjectVersion", "*/jobs/*/generated/*",
     "the versioned outputs bucket, as for the Batch job below"),
    (BATCH_FINALIZE, "s3:DeleteObjectVersion", "*/jobs/*/generated/*",
     "the deployed outputs bucket is versioned: a blocked job's raw output is deleted by version after its copy to "
     "quarantine/ (moto's copy of the bucket is not versioned, so the survey sees a plain DeleteObject; the "
     "versioned path is tests/functional/runtime/test_rt_finalize.py)"),
]

DATA_SERVICES = ("dynamodb", "s3", "sqs", "secretsmanager", "states", "events", "batch")


def _generalise(text: str) -> str:
    return re.sub(r"job_[0-9a-z]{26}", "<job>", text)


@pytest.fixture(scope="module")
def resolved(tpl, survey):
    return Template(tpl, REGION, ACCOUNT, survey.physical)


def _role(tpl: dict, key: str) -> str:
    if key.startswith("batch_job:"):  # the role of the job definition the Batch job ran under
        (definition,) = [r["Properties"] for r in tpl["Resources"].values() if r["Type"] == "AWS::Batch::JobDefinition"
                         and r["Properties"]["JobDefinitionName"] == key.split(":", 1)[1]]
        return definition["ContainerProperties"]["JobRoleArn"]["Fn::GetAtt"][0]
    (fn,) = [r for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == key]
    return fn["Properties"]["Role"]["Fn::GetAtt"][0]


def _requests(survey, resolved, key: str) -> list[Request]:
    (machine,) = [k for k, r in resolved.resources.items() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    token = resolved.ref(machine)
    return [r for svc, op, p in survey.calls.get(key, [])
            for r in requests_for(svc, op, p, REGION, ACCOUNT, token_resource=token)]


def test_the_survey_ran_every_scenario_and_every_function(survey):
    assert survey.outcomes["succeeded"] == "SUCCEEDED" and survey.outcomes["rejected"] == "REJECTED"
    assert survey.outcomes["failed"] == "FAILED" and survey.outcomes["onprem"] == "SUCCEEDED"
    assert survey.outcomes["unregistered_model"] == "400 workload.model"
    assert survey.outcomes["models_listed"] == "200 wan-tiny"
    assert survey.outcomes["onprem_cancelled"] == "CANCELLED"
    assert survey.outcomes["finalize_failed"] == "FAILED"
    # blocked frames: the raw output's version under jobs/ is gone, the copy waits under quarantine/, no link
    assert survey.outcomes["blocked_output"] == "BLOCKED"
    assert survey.outcomes["blocked_raw_versions"] == "0" and survey.outcomes["blocked_quarantined"] == "True"
    assert survey.outcomes["blocked_output_route"] == "409 False"
    # the execution ends FAILED exactly when the job does (JobEnded → JobFailed)
    assert survey.outcomes["failed_execution"] == survey.outcomes["finalize_failed_execution"] == "FAILED"
    assert survey.outcomes["succeeded_execution"] == "SUCCEEDED"
    # a stripped copy of the SUCCEEDED job is matched back to it (Publish's index, the lookup's own function)
    assert survey.outcomes["provenance_lookup"].startswith("job_")
    assert survey.outcomes["cancelled_pending"] == survey.outcomes["cancelled_running"] == "CANCELLED"
    assert int(survey.outcomes["webhooks_received"]) >= 1
    assert int(survey.outcomes["endpoint_deliveries"]) >= 1  # the SUCCEEDED job's completion, to the endpoint
    actions = survey.outcomes["admin"].split(",")  # newest first; node registrations are audited too
    assert actions.index("user.add") < actions.index("team.create") < actions.index("tenant.create")
    assert actions[:3] == ["node.deregister", "safety.report", "pool.delete"]
    assert "node.register" in actions and actions.index("node.deregister") < actions.index("node.register")
    assert actions.index("model.deregister") < actions.index("model.register")  # the catalog's changes are audited
    # every Batch job ran under one of the platform's two job definitions, and both ran
    assert {k for k in survey.calls if k.startswith("batch_job:")} == set(BATCH_KEYS)
    missing = {f.key for f in ALL_FUNCTIONS} - set(survey.calls)
    if survey.containers_unavailable:
        missing -= CONTAINER_ONLY
    else:
        assert survey.outcomes["container"] == "SUCCEEDED"
    assert not missing, f"no call recorded for {missing}"


def _needs_containers(survey, key: str) -> None:
    if key in CONTAINER_ONLY and survey.containers_unavailable:
        pytest.skip(f"{key} runs only in the container scenario; tenant containers unavailable: "
                    f"{survey.containers_unavailable}")


@pytest.mark.parametrize("key", [f.key for f in ALL_FUNCTIONS] + list(BATCH_KEYS))
def test_every_recorded_call_is_allowed_by_the_functions_role(tpl, survey, resolved, key):
    _needs_containers(survey, key)
    statements = resolved.role_statements(_role(tpl, key))
    reqs = _requests(survey, resolved, key)
    assert reqs, f"{key} made no call"
    denied = sorted({_generalise(f"{r.action} {r.resource} {r.context}") for r in reqs if not allowed_by(statements, r)})
    assert not denied, f"denied by the role of {key}:\n" + "\n".join(denied)


@pytest.mark.parametrize("key", [f.key for f in ALL_FUNCTIONS] + list(BATCH_KEYS))
def test_every_data_permission_of_the_role_is_used(tpl, survey, resolved, key):
    """The converse: a (statement, action) on data that no recorded call needs is an excess grant."""
    _needs_containers(survey, key)
    statements = resolved.role_statements(_role(tpl, key))
    reqs = _requests(survey, resolved, key)
    excess = []
    for s in statements:
        if s.get("Effect") != "Allow":  # a Deny narrows; it grants nothing to be used
            continue
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        for action in actions:
            if action in SERVICE_SIDE or action.split(":")[0] not in DATA_SERVICES:
                continue
            single = {**s, "Action": action}
            if any(allowed_by([single], r) for r in reqs if r.action == action):
                continue
            if survey.containers_unavailable and (key, action) in CONTAINER_ONLY_CALLS:
                continue  # exercised only by the container scenario, which did not run here
            if any(k == key and a == action and any(_match(pat, res) for res in resources)
                   for k, a, pat, _ in UNEXERCISED):
                continue
            excess.append(f"{action} on {resources} {s.get('Condition', '')}")
    assert not excess, f"{key} holds permissions no recorded call uses:\n" + "\n".join(excess)


def _match(pattern: str, resource: str) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(resource, pattern)


@pytest.mark.parametrize("key", [f.key for f in ALL_FUNCTIONS] + list(BATCH_KEYS))
def test_no_wildcard_resource_on_data(tpl, resolved, key):
    for s in resolved.role_statements(_role(tpl, key)):
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        # ListStreams (the stream event source) supports no resource scoping and returns stream ARNs only
        data = [a for a in actions if a.split(":")[0] in ("dynamodb", "s3", "sqs", "secretsmanager")
                and a != "dynamodb:ListStreams"]
        assert not (data and "*" in resources), f"{key}: {data} on *"
        for r in resources:
            assert not re.search(r":table/\*|arn:aws:s3:::\*|:sqs:[^:]+:[^:]+:\*$", r), f"{key}: {actions} on {r}"


def test_cloud_generate_attempts_load_the_published_model_and_no_one_else_touches_the_models_bucket(survey):
    """The operator published the tiny model to the stack's models root: every cloud generate attempt reads its
    manifest there (the GPU definition's GPUFLEET_MODEL_S3_ROOT; its files once, into the shared cache), with the run
    role, whose grant the other tests check; of the control-plane functions only the administration API calls the
    models bucket: it reads the manifests of the models an operator registers, nothing else."""
    (bucket,) = [v for k, v in survey.physical.items() if k.startswith("DataModels") and "Policy" not in k]
    touched = {k: [(op, p.get("Key")) for svc, op, p in calls if svc == "s3" and p.get("Bucket") == bucket]
               for k, calls in survey.calls.items()}
    touched = {k: v for k, v in touched.items() if v}
    assert set(touched) == {BATCH_RUN, "admin_api"}, touched
    assert ("GetObject", "models/wan-tiny/manifest.json") in touched[BATCH_RUN]
    assert sorted(set(touched["admin_api"])) == [("GetObject", "models/lab-model/manifest.json"),
                                                 ("GetObject", "models/wan-survey/manifest.json")]
    assert {op for op, _ in touched[BATCH_RUN]} <= {"GetObject", "HeadObject"}


def test_only_the_finalize_stage_reads_the_signing_secret(survey):
    """Of every principal, only the finalize stage — Batch jobs of the finalize (CPU) definition and FinalizeLambda —
    reads the C2PA key (the API reads its cursor key, the provenance lookup the watermark keys, neither the
    signing key)."""
    (signing,) = [v for k, v in survey.physical.items() if k.startswith("ComputeSigningSecret")
                  and not k.startswith("ComputeSigningSecretPolicy")]
    secrets = {k: {str((p or {}).get("SecretId")) for svc, op, p in calls
                   if svc == "secrets-manager" and op == "GetSecretValue"} for k, calls in survey.calls.items()}
    readers = {k for k, ids in secrets.items() if any(signing in i or i in signing for i in ids)}
    assert readers == {BATCH_FINALIZE, "finalize"}, secrets


def test_finalize_embeds_and_the_lookup_detects_with_the_deployments_watermark_secret(survey):
    """Both finalize paths read the template's watermark secret (the key they embed with) and the provenance
    lookup's own function reads it (the key it detects with): the survey's lookup matched its job with it. No one
    else reads it — not the API function, which answers the route 409 without a key."""
    (wm,) = [v for k, v in survey.physical.items() if k.startswith("ComputeWatermarkSecret")
             and not k.startswith("ComputeWatermarkSecretPolicy")]
    secrets = {k: {str((p or {}).get("SecretId")) for svc, op, p in calls
                   if svc == "secrets-manager" and op == "GetSecretValue"} for k, calls in survey.calls.items()}
    readers = {k for k, ids in secrets.items() if any(wm in i or i in wm for i in ids)}
    assert readers == {BATCH_FINALIZE, "finalize", "provenance_lookup"}, secrets
    assert survey.outcomes["provenance_lookup"]


def test_a_cloud_supervisors_calls_are_the_supervisor_roles_object_calls(tpl, survey, resolved):
    """The cloud container job's supervisor (no task role) calls AWS only with the session the node API vended for
    its attempt: object calls the CloudSupervisorRole's own policy allows (its session policy narrows them to the
    job's prefixes: tests/functional/nodeapi/test_nodeapi_supervisor.py), and no DynamoDB, Step Functions or Batch
    call (its job writes and its answers to the Run state are node API requests)."""
    if survey.containers_unavailable:
        pytest.skip(f"tenant containers unavailable: {survey.containers_unavailable}")
    calls = survey.calls.get("cloud_supervisor", [])
    assert calls and {svc for svc, _, _ in calls} == {"s3"}, sorted({(svc, op) for svc, op, _ in calls})
    (role,) = [k for k, r in tpl["Resources"].items()
               if r["Type"] == "AWS::IAM::Role" and k.startswith("OnPremCloudSupervisorRole")]
    statements = resolved.role_statements(role)
    reqs = _requests(survey, resolved, "cloud_supervisor")
    denied = sorted({_generalise(f"{r.action} {r.resource}") for r in reqs if not allowed_by(statements, r)})
    assert not denied, "denied by the cloud supervisor role:\n" + "\n".join(denied)
    assert any(r.action == "s3:PutObject" and "/output/" in r.resource for r in reqs)  # its outputs, uploaded
