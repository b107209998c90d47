"""Template assertions of the trust boundaries: workflow logging and Batch targets, the alarm topic's key,
the agents' Roles Anywhere trust, node ids that cannot collide with queue suffixes."""

from __future__ import annotations

import json

import pytest

from gpufleet.errors import ValidationFailed

pytestmark = pytest.mark.xdist_group("cdk-synth")


def _of_type(tpl: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in tpl["Resources"].items() if r["Type"] == kind}


def _definition(tpl: dict) -> dict:
    (sm,) = _of_type(tpl, "AWS::StepFunctions::StateMachine").values()
    parts = sm["Properties"]["DefinitionString"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else json.dumps(p).replace('"', "'") for p in parts)
    return json.loads(text)


def test_the_workflow_logs_errors_without_execution_data(tpl):
    (sm,) = _of_type(tpl, "AWS::StepFunctions::StateMachine").values()
    logging = sm["Properties"]["LoggingConfiguration"]
    assert logging["Level"] == "ERROR" and logging["IncludeExecutionData"] is False


def test_run_cloud_takes_queue_and_definition_from_the_definition_not_the_placement(tpl):
    d = _definition(tpl)["States"]
    run = d["RunCloud"]
    assert run["Resource"].endswith("batch:submitJob.sync")
    assert run["Parameters"]["JobQueue.$"] == "$.batch.job_queue"
    assert run["Parameters"]["JobDefinition.$"] == "$.batch.job_definition"
    assert "$.run.value.job_queue" not in json.dumps(run) and "$.run.value.job_definition" not in json.dumps(run)
    queues = {_of_type(tpl, "AWS::Batch::JobQueue")[k]["Properties"]["JobQueueName"]: k
              for k in _of_type(tpl, "AWS::Batch::JobQueue")}
    (gpu_def,) = [k for k, r in _of_type(tpl, "AWS::Batch::JobDefinition").items() if "Gpu" in k and "Gang" not in k]
    for state, queue in (("UseSpotQueue", "gpufleet-gpu-spot"), ("UseOnDemandQueue", "gpufleet-gpu-ondemand"),
                         ("UseGangQueue", "gpufleet-gpu-gang")):
        assert d[state]["Type"] == "Pass" and d[state]["ResultPath"] == "$.batch" and d[state]["Next"] == "CloudGang"
        params = json.dumps(d[state]["Parameters"])
        assert queues[queue] in params and gpu_def in params and ".$" not in params
    choices = {c.get("StringEquals"): c["Next"] for c in d["RouteTarget"]["Choices"]}
    assert choices == {"onprem": "RunOnPrem", "gpufleet-gpu-spot": "UseSpotQueue",
                       "gpufleet-gpu-ondemand": "UseOnDemandQueue", "gpufleet-gpu-gang": "UseGangQueue"}
    # a single-node run goes to CloudWorkload whatever the queue; a gang only to RunCloudGang on the gang queue
    gang = d["CloudGang"]
    assert gang["Default"] == "CloudWorkload" and [c["Next"] for c in gang["Choices"]] == ["RunCloudGang", "MarkFailed"]
    # a container job runs its image beside the supervisor (RunCloudContainer), a video job the runtime (RunCloud)
    (rule,) = d["CloudWorkload"]["Choices"]
    assert rule["Next"] == "RunCloudContainer" and d["CloudWorkload"]["Default"] == "RunCloud"
    assert {"Variable": "$.run.value.workload", "StringEquals": "container"} in rule["And"]
    assert queues["gpufleet-gpu-gang"] in json.dumps(gang["Choices"][0])
    (gang_def,) = [k for k in _of_type(tpl, "AWS::Batch::JobDefinition") if "Gang" in k]
    submit = d["RunCloudGang"]
    assert submit["Resource"].endswith("aws-sdk:batch:submitJob") and gang_def in json.dumps(submit["Parameters"])
    assert submit["Parameters"]["JobQueue.$"] == "$.batch.job_queue"
    assert submit["Parameters"]["NodeOverrides.$"] == "$.run.value.node_overrides"
    assert "ContainerOverrides" not in submit["Parameters"]  # a multi-node job takes NodeOverrides only
    assert d["RouteTarget"]["Default"] == "MarkFailed"  # a queue that is not the platform's is refused
    assert d["FinalizeStage"]["Parameters"]["JobQueue"] and "JobQueue.$" not in d["FinalizeStage"]["Parameters"]


def test_run_cloud_container_keeps_the_token_and_the_env_out_of_the_state(tpl):
    """RunCloudContainer invokes the dispatch function with .waitForTaskToken: no Batch parameter (no
    EcsPropertiesOverride) is in the state, the task token is a parameter of the invoke only, and a silent run is
    caught by HeartbeatSeconds and classified as RunCloud's is."""
    d = _definition(tpl)["States"]
    run = d["RunCloudContainer"]
    assert run["Resource"].endswith("lambda:invoke.waitForTaskToken")
    payload = run["Parameters"]["Payload"]
    assert payload == {"job_id.$": "$.job_id", "token.$": "$$.Task.Token", "run.$": "$.run.value", "batch.$": "$.batch"}
    (fn,) = [k for k, r in _of_type(tpl, "AWS::Lambda::Function").items()
             if r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == "dispatch_cloud"]
    assert fn in json.dumps(run["Parameters"]["FunctionName"])
    assert "EcsProperties" not in json.dumps(d) and "ecsProperties" not in json.dumps(d)
    assert run["HeartbeatSeconds"] == 10 and run["Next"] == "CompleteRun"  # LOCAL_CONTEXT's cloud heartbeat
    assert run["TimeoutSeconds"] == d["RunCloud"]["TimeoutSeconds"]
    assert {c["Next"] for c in run["Catch"]} == {"ClassifyFailure"}
    assert {e for c in run["Catch"] for e in c["ErrorEquals"]} >= {"States.ALL", "States.HeartbeatTimeout"}


def _statements(tpl: dict, role: str) -> list[dict]:
    return [s for p in _of_type(tpl, "AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def test_the_cloud_dispatch_role_registers_and_submits_tenant_definitions_and_passes_one_role(tpl):
    (fn,) = [r for r in _of_type(tpl, "AWS::Lambda::Function").values()
             if r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == "dispatch_cloud"]
    batch = {}
    for s in _statements(tpl, fn["Properties"]["Role"]["Fn::GetAtt"][0]):
        for a in s["Action"] if isinstance(s["Action"], list) else [s["Action"]]:
            if a.split(":")[0] in ("batch", "iam"):
                batch[a] = json.dumps(s["Resource"])
    assert set(batch) == {"batch:SubmitJob", "batch:RegisterJobDefinition", "batch:TagResource",
                          "batch:DescribeJobDefinitions", "iam:PassRole"}
    for action in ("batch:SubmitJob", "batch:RegisterJobDefinition", "batch:TagResource"):
        assert ":job-definition/gpufleet-tenant-*" in batch[action], action
    assert "GpuJob" not in batch["batch:SubmitJob"] and "CpuQueue" not in batch["batch:SubmitJob"]
    assert all(q in batch["batch:SubmitJob"] for q in ("GpuSpotQueue", "GpuOnDemandQueue", "GpuGangQueue"))
    assert batch["batch:DescribeJobDefinitions"] == '"*"'  # no resource-level permission
    assert "TenantExecutionRole" in batch["iam:PassRole"] and "*" not in batch["iam:PassRole"]
    env = fn["Properties"]["Environment"]["Variables"]
    assert "TenantExecutionRole" in json.dumps(env["GPUFLEET_TENANT_EXECUTION_ROLE_ARN"])
    assert env["GPUFLEET_PREFIX"] == "gpufleet" and "execute-api" in json.dumps(env["GPUFLEET_NODE_API_URL"])


def test_the_tenant_execution_role_only_pulls_images_and_writes_logs(tpl):
    (role,) = [k for k in _of_type(tpl, "AWS::IAM::Role") if k.startswith("ComputeTenantExecutionRole")]
    trust = _of_type(tpl, "AWS::IAM::Role")[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "ecs-tasks.amazonaws.com"}]
    actions = {a for s in _statements(tpl, role) for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert actions == {"ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
                       "ecr:BatchGetImage", "logs:CreateLogStream", "logs:PutLogEvents"}
    assert not _of_type(tpl, "AWS::IAM::Role")[role]["Properties"].get("ManagedPolicyArns")


def test_the_workflow_role_submits_only_to_named_queues_and_definitions(tpl):
    (role,) = [k for k in _of_type(tpl, "AWS::IAM::Role") if k.startswith("OrchestrationWorkflowRole")]
    statements = [s for p in _of_type(tpl, "AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    (submit,) = [s for s in statements if "batch:SubmitJob" in json.dumps(s["Action"])]
    assert "*" not in json.dumps(submit["Resource"])
    named = {x["Fn::GetAtt"][0] if "Fn::GetAtt" in x else x["Ref"] for x in submit["Resource"]}
    assert named == set(_of_type(tpl, "AWS::Batch::JobQueue")) | set(_of_type(tpl, "AWS::Batch::JobDefinition"))


def test_the_alarm_topic_uses_a_customer_managed_key_that_admits_cloudwatch(tpl):
    (topic,) = _of_type(tpl, "AWS::SNS::Topic").values()
    key_ref = topic["Properties"]["KmsMasterKeyId"]
    (key_id,) = [k for k in _of_type(tpl, "AWS::KMS::Key") if key_ref == {"Fn::GetAtt": [k, "Arn"]}]
    key = tpl["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    (cw,) = [s for s in key["KeyPolicy"]["Statement"]
             if s.get("Principal", {}).get("Service") == "cloudwatch.amazonaws.com"]
    assert cw["Effect"] == "Allow" and set(cw["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    topic = [{"Ref": next(iter(_of_type(tpl, "AWS::SNS::Topic")))}]
    composites = _of_type(tpl, "AWS::CloudWatch::CompositeAlarm")
    assert composites and all(c["Properties"]["AlarmActions"] == topic for c in composites.values())
    in_composite = {lid for c in composites.values() for lid in _of_type(tpl, "AWS::CloudWatch::Alarm")
                    if lid in json.dumps(c["Properties"]["AlarmRule"])}
    alarms = _of_type(tpl, "AWS::CloudWatch::Alarm")
    # every alarm pages through the topic, except the burn-rate windows: their composite (SLO) alarm pages
    assert alarms and all(a["Properties"]["AlarmActions"] == topic for lid, a in alarms.items() if lid not in in_composite)
    assert all("AlarmActions" not in alarms[lid]["Properties"] for lid in in_composite)


def _agent_trust(tpl: dict) -> list[dict]:
    (role,) = [r for k, r in _of_type(tpl, "AWS::IAM::Role").items() if k.startswith("OnPremAgentRole")]
    return role["Properties"]["AssumeRolePolicyDocument"]["Statement"]


def test_the_agent_roles_session_name_must_be_the_certificate_cn(tpl):
    (assume,) = [s for s in _agent_trust(tpl) if s["Action"] == "sts:AssumeRole"]
    assert assume["Condition"]["StringEquals"]["sts:RoleSessionName"] == "${aws:PrincipalTag/x509Subject/CN}"


def test_the_agent_role_trusts_only_the_templates_anchor_and_node_cns(tpl):
    statements = _agent_trust(tpl)
    assert {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {
        "sts:AssumeRole", "sts:TagSession", "sts:SetSourceIdentity"}
    for s in statements:
        c = s["Condition"]
        assert s["Principal"] == {"Service": "rolesanywhere.amazonaws.com"}
        # no CA configured in this synth: the anchor named does not exist, nobody can assume the role
        assert "trust-anchor/none-configured" in json.dumps(c["ArnEquals"]["aws:SourceArn"])
        assert c["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
        # no CN may name another node's dead-letter or signal queue as its own queue
        assert {"*-dlq", "*_*"} <= set(c["StringNotLike"]["aws:PrincipalTag/x509Subject/CN"])
    assert not _of_type(tpl, "AWS::RolesAnywhere::TrustAnchor")


def test_a_configured_node_ca_becomes_the_trust_anchor_and_a_profile_of_the_agent_role_only():
    import aws_cdk as cdk
    from aws_cdk import aws_events as events
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk.assertions import Template

    from infra.config import InfraConfig
    from infra.data import Data
    from infra.onprem import OnPrem

    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    stack = cdk.Stack(cdk.App(), "NodeTrust")
    config = InfraConfig(node_ca_pem=pem)
    fn = lambda_.Function(stack, "Register", runtime=lambda_.Runtime.PYTHON_3_11, handler="x.handler",
                          code=lambda_.Code.from_inline("def handler(e, c): pass"))
    node_api = lambda_.Function(stack, "NodeApi", runtime=lambda_.Runtime.PYTHON_3_11, handler="x.handler",
                                code=lambda_.Code.from_inline("def handler(e, c): pass"))
    onprem = OnPrem(stack, "OnPrem", config=config, data=Data(stack, "Data", config=config),
                    bus=events.EventBus(stack, "Bus"), register_function=fn, node_api_function=node_api,
                    node_api_arn="arn:aws:execute-api:us-east-1:123456789012:api/v1/*/v1/node/*",
                    node_attempt_routes_arn="arn:aws:execute-api:us-east-1:123456789012:api/v1/POST/v1/node/jobs/*",
                    execute_api_arn="arn:aws:execute-api:us-east-1:123456789012:api")
    t = Template.from_stack(stack).to_json()
    (anchor_id,) = _of_type(t, "AWS::RolesAnywhere::TrustAnchor")
    anchor = t["Resources"][anchor_id]["Properties"]
    assert anchor["Source"] == {"SourceType": "CERTIFICATE_BUNDLE", "SourceData": {"X509CertificateData": pem}}
    (profile,) = _of_type(t, "AWS::RolesAnywhere::Profile").values()
    role_id = stack.get_logical_id(onprem.agent_role.node.default_child)
    assert profile["Properties"]["RoleArns"] == [{"Fn::GetAtt": [role_id, "Arn"]}]
    # the agent names its session after its CN; the trust policy checks it (the node API's identity of the node)
    assert profile["Properties"]["AcceptRoleSessionName"] is True
    for s in _agent_trust(t):
        assert s["Condition"]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [anchor_id, "TrustAnchorArn"]}


@pytest.mark.parametrize("node_id", ["node-7", "dev-node-1", "a1", "rack-12-gpu-3", "x" * 42, "dlq", "node-dlq2"])
def test_node_ids_that_register(node_id):
    from lambdas.nodes.register import validate_node_id

    assert validate_node_id(node_id) == node_id


@pytest.mark.parametrize("node_id", ["node-7-dlq", "x-dlq", "a", "-node", "node-", "Node-7", "node_7", "node.7",
                                     "node/7", "x" * 43, ""])
def test_node_ids_that_cannot_collide_with_queue_suffixes_or_patterns_are_refused(node_id):
    from lambdas.nodes.register import handler

    with pytest.raises(ValidationFailed):
        handler({"node_id": node_id})
    resp = handler({"httpMethod": "POST", "body": json.dumps({"node_id": node_id})})
    assert resp["statusCode"] == 400 and "node_id" in resp["body"]


def test_batch_instances_require_imdsv2_with_hop_limit_1(tpl):
    templates = _of_type(tpl, "AWS::EC2::LaunchTemplate")
    assert len(templates) == 2  # the CPU workers', and the GPU workers' (with the host cache's user data)
    for lt in templates.values():
        md = lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]
        assert md["HttpTokens"] == "required" and md["HttpPutResponseHopLimit"] == 1 and md["HttpEndpoint"] == "enabled"
    envs = _of_type(tpl, "AWS::Batch::ComputeEnvironment")
    assert len(envs) == 4  # GPU spot, GPU on-demand, GPU gang (on-demand), CPU
    for name, env in envs.items():
        ref = env["Properties"]["ComputeResources"]["LaunchTemplate"]
        assert ref["LaunchTemplateId"]["Ref"] in templates, name


def test_workflow_branches_on_the_workload_kind(tpl):
    d = _definition(tpl)["States"]
    assert d["CompleteRun"]["Next"] == "WorkloadKind"
    (rule,) = d["WorkloadKind"]["Choices"]
    assert rule == {"Variable": "$.completed.value.workload", "StringEquals": "container", "Next": "CollectOutputs"}
    assert d["WorkloadKind"]["Default"] == "FinalizeRoute"
    assert d["CollectOutputs"]["Next"] == "Publish" and d["FinalizeStage"]["Next"] == "Publish"
    assert d["FinalizeLambda"]["Next"] == "Publish"
    catches = {tuple(c["ErrorEquals"]): c["Next"] for c in d["CollectOutputs"]["Catch"]}
    assert catches[("Cancelled", "OutputTooLarge")] == "ClassifyFailure"
    assert catches[("States.ALL",)] == "MarkFinalizeFailed"


def test_finalize_routes_short_clips_to_the_warm_lambda_with_the_batch_jobs_retries(tpl):
    from gpufleet.local.synth import LOCAL_CONTEXT

    bound = LOCAL_CONTEXT["gpufleet:finalize_lambda_max_pixels"]  # the production default: test_infra_webhook_allow_private
    d = _definition(tpl)["States"]
    (rule,) = d["FinalizeRoute"]["Choices"]
    assert rule == {"And": [{"Variable": "$.completed.value.finalize_pixels", "IsPresent": True},
                            {"Variable": "$.completed.value.finalize_pixels",
                             "NumericLessThanEquals": bound}], "Next": "FinalizeLambda"}
    assert d["FinalizeRoute"]["Default"] == "FinalizeStage"  # a large clip, or a state without the figure: Batch
    warm, batch = d["FinalizeLambda"], d["FinalizeStage"]
    # the Lambda gets the job id and the Batch job's very command (the pointer envelope: no spec, no prompt)
    assert warm["Parameters"]["Payload"] == {"job_id.$": "$.job_id", "command.$": "$.completed.value.finalize_command"}
    assert batch["Parameters"]["ContainerOverrides"]["Command.$"] == "$.completed.value.finalize_command"
    assert warm["Retry"] == batch["Retry"] and warm["Catch"] == batch["Catch"]
    # the context's interval, tries and back-off rate (a local stack's: 1 s, 3 tries, 1: every retry 1 s apart)
    (retry,) = warm["Retry"]
    assert (retry["IntervalSeconds"], retry["MaxAttempts"], retry["BackoffRate"]) == (
        LOCAL_CONTEXT["gpufleet:finalize_retry_interval_seconds"], 3, LOCAL_CONTEXT["gpufleet:finalize_retry_backoff_rate"])
    assert [c["Next"] for c in warm["Catch"]] == ["MarkFinalizeFailed"]
    assert warm["ResultPath"] == batch["ResultPath"] == "$.finalized"
    assert set(warm["ResultSelector"]) == {"exit_code.$", "blocked.$"}  # not the stage's scores or keys


def test_collect_outputs_may_only_list_the_outputs_bucket_and_update_jobs(tpl):
    (fn,) = [r for r in _of_type(tpl, "AWS::Lambda::Function").values()
             if r["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == "collect_outputs"]
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    actions = set()
    for pol in _of_type(tpl, "AWS::IAM::Policy").values():
        if {"Ref": role} in pol["Properties"]["Roles"]:
            for st in pol["Properties"]["PolicyDocument"]["Statement"]:
                acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                actions |= set(acts)
    data = {a for a in actions if a.startswith(("s3:", "dynamodb:"))}
    assert data == {"s3:ListBucket", "dynamodb:GetItem", "dynamodb:UpdateItem"}


def test_cloud_container_definitions_give_the_tenant_no_role_or_credentials():
    from gpufleet import batchdef

    d = batchdef.job_definition(prefix="gpufleet", image="r/x@sha256:" + "0" * 64, supervisor_image="r/rt:1",
                                execution_role_arn="arn:aws:iam::1:role/e", log_group="g", region="us-east-1",
                                timeout_s=60)
    assert batchdef.credential_exposure(d) == []
