"""Template assertions on the synthesized stack (the same one the local harness deploys)."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match, Template

from gpufleet.local.synth import synthesize, template
from gpufleet.store.schema import TABLES
from infra.config import ALL_FUNCTIONS, CHECKPOINT_ENDED_TAG, CONTEXT_PREFIX, TASK_FUNCTIONS

pytestmark = pytest.mark.xdist_group("cdk-synth")

DATA_SERVICES = ("dynamodb", "s3", "sqs", "kms", "states", "batch", "events", "logs")


def resources(tpl: dict, rtype: str) -> dict[str, dict]:
    return {k: r for k, r in tpl["Resources"].items() if r["Type"] == rtype}


def policy_statements(tpl: dict):
    for rid, r in tpl["Resources"].items():
        props = r.get("Properties", {})
        if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            yield from ((rid, s) for s in props["PolicyDocument"]["Statement"])
        if r["Type"] == "AWS::IAM::Role":
            for p in props.get("Policies", []):
                yield from ((rid, s) for s in p["PolicyDocument"]["Statement"])


def as_list(x):
    return x if isinstance(x, list) else [x]


def definition(tpl: dict) -> dict:
    """The state machine definition with every intrinsic replaced by a placeholder string."""
    (sm,) = resources(tpl, "AWS::StepFunctions::StateMachine").values()
    body = sm["Properties"]["DefinitionString"]
    if isinstance(body, dict):
        body = "".join(p if isinstance(p, str) else "X" for p in body["Fn::Join"][1])
    return json.loads(body)


def test_every_api_method_requires_iam_but_the_supervisor_token_exchange(tpl):
    methods = resources(tpl, "AWS::ApiGateway::Method")
    assert len(methods) >= 2
    open_ = {k: m["Properties"] for k, m in methods.items() if m["Properties"]["AuthorizationType"] != "AWS_IAM"}
    # POST /v1/node/cloud/credentials: a cloud supervisor has no AWS identity; its one-time token is the credential
    [(key, exchange)] = open_.items()
    assert "v1nodecloudcredentials" in key and exchange["HttpMethod"] == "POST"
    assert exchange["AuthorizationType"] == "NONE" and "NodeApi" in json.dumps(exchange["Integration"]["Uri"])


def test_provenance_lookups_reach_their_own_function_under_iam(tpl):
    methods = resources(tpl, "AWS::ApiGateway::Method")
    (lookup,) = [m["Properties"] for k, m in methods.items() if "v1provenancelookup" in k]
    assert lookup["HttpMethod"] == "POST" and lookup["AuthorizationType"] == "AWS_IAM"
    uri = json.dumps(lookup["Integration"]["Uri"])
    assert "FunctionsProvenanceLookup" in uri and "FunctionsApi" not in uri
    fns = {k: f["Properties"] for k, f in resources(tpl, "AWS::Lambda::Function").items()
           if k.startswith("FunctionsProvenanceLookup")}
    (props,) = fns.values()
    assert props["MemorySize"] == 2048 and "ReservedConcurrentExecutions" not in props  # none by default
    bounded = template(synthesize({f"{CONTEXT_PREFIX}lookup_reserved_concurrency": 20}))
    (props,) = [f["Properties"] for k, f in resources(bounded, "AWS::Lambda::Function").items()
                if k.startswith("FunctionsProvenanceLookup")]
    assert props["ReservedConcurrentExecutions"] == 20


def test_api_stage_has_access_logs_and_throttling(tpl):
    t = Template.from_json(tpl)
    t.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "AccessLogSetting": {"DestinationArn": Match.any_value(), "Format": Match.string_like_regexp("requestId")},
            "TracingEnabled": True,
            "MethodSettings": Match.array_with(
                [Match.object_like({"ThrottlingRateLimit": Match.any_value(), "ThrottlingBurstLimit": Match.any_value()})]
            ),
        },
    )


def test_no_statement_grants_wildcard_actions(tpl):
    offenders = []
    for rid, s in policy_statements(tpl):
        if s.get("Effect") != "Allow":
            continue
        for action in as_list(s["Action"]):
            if action == "*" or (action.endswith(":*") and action.split(":")[0] in DATA_SERVICES):
                offenders.append((rid, action))
    assert offenders == []


def test_buckets_encrypted_private_tls_only_with_lifecycle(tpl):
    buckets = resources(tpl, "AWS::S3::Bucket")
    assert len(buckets) == 5  # outputs, checkpoints, logs, models and their access logs
    policies = {
        p["Properties"]["Bucket"]["Ref"]: p["Properties"]["PolicyDocument"]["Statement"]
        for p in resources(tpl, "AWS::S3::BucketPolicy").values()
    }
    for bid, b in buckets.items():
        props = b["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"], bid
        assert all(props["PublicAccessBlockConfiguration"].values()), bid
        assert props["LifecycleConfiguration"]["Rules"], bid
        tls = [
            s
            for s in policies[bid]
            if s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        ]
        assert tls, f"{bid} has no TLS-only statement"


def test_checkpoints_expire_after_job_end(tpl):
    key, value = CHECKPOINT_ENDED_TAG
    rules = [
        r
        for b in resources(tpl, "AWS::S3::Bucket").values()
        for r in b["Properties"]["LifecycleConfiguration"]["Rules"]
    ]
    tagged = [r for r in rules if r.get("TagFilters") == [{"Key": key, "Value": value}]]
    assert len(tagged) == 1 and tagged[0]["ExpirationInDays"] == 1


def test_tables_follow_schema_with_pitr_encryption_streams(tpl):
    tables = resources(tpl, "AWS::DynamoDB::Table")
    assert len(tables) == len(TABLES)
    for r in tables.values():
        p = r["Properties"]
        assert p["SSESpecification"]["SSEEnabled"] is True
        assert p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    for t in TABLES.values():
        (p,) = [r["Properties"] for k, r in tables.items() if k.startswith(f"Data{t.logical.capitalize()}Table")]
        assert sorted(g["IndexName"] for g in p.get("GlobalSecondaryIndexes", [])) == sorted(i.name for i in t.indexes)
        assert p["KeySchema"][0] == {"AttributeName": t.hash_key, "KeyType": "HASH"}
        if t.stream:
            assert p["StreamSpecification"] == {"StreamViewType": t.stream}
        if t.ttl_attribute:
            assert p["TimeToLiveSpecification"] == {"AttributeName": t.ttl_attribute, "Enabled": True}


def test_batch_spot_and_ondemand_gpu_environments_and_cpu_queue(tpl):
    envs = [r["Properties"]["ComputeResources"] for r in resources(tpl, "AWS::Batch::ComputeEnvironment").values()]
    assert {(e["Type"], e["AllocationStrategy"]) for e in envs} >= {
        ("SPOT", "SPOT_PRICE_CAPACITY_OPTIMIZED"),
        ("EC2", "BEST_FIT_PROGRESSIVE"),
    }
    names = {r["Properties"]["JobQueueName"] for r in resources(tpl, "AWS::Batch::JobQueue").values()}
    assert names == {"gpufleet-gpu-spot", "gpufleet-gpu-ondemand", "gpufleet-gpu-gang", "gpufleet-cpu"}
    gpu_defs = [
        d
        for d in resources(tpl, "AWS::Batch::JobDefinition").values()
        if {"Type": "GPU", "Value": "1"} in d["Properties"].get("ContainerProperties", {}).get("ResourceRequirements", [])
    ]
    assert len(gpu_defs) == 1
    props = gpu_defs[0]["Properties"]["ContainerProperties"]
    assert props["Command"] == ["python", "-m", "gpufleet.runtime"]
    assert "container-assets" in json.dumps(props["Image"])  # the gpu_container image asset


def test_cloud_gangs_run_as_multi_node_parallel_jobs_on_their_own_on_demand_environment(tpl):
    """Issue 14: the gang queue's compute environment is on-demand (Batch runs no multi-node parallel job on
    Spot), in one subnet and a cluster placement group, with a security group open only to its own members; the
    gang definition runs the GPU runtime on every node of the open range 0: (so NodeOverrides set the count)."""
    from gpufleet.pools import DEFAULT_POOLS

    queues = {r["Properties"]["JobQueueName"]: r for r in resources(tpl, "AWS::Batch::JobQueue").values()}
    (order,) = queues["gpufleet-gpu-gang"]["Properties"]["ComputeEnvironmentOrder"]
    envs = resources(tpl, "AWS::Batch::ComputeEnvironment")
    gang_env = envs[order["ComputeEnvironment"]["Fn::GetAtt"][0]]["Properties"]["ComputeResources"]
    assert gang_env["Type"] == "EC2" and len(gang_env["Subnets"]) == 1  # on-demand, one Availability Zone
    (pg,) = resources(tpl, "AWS::EC2::PlacementGroup").values()
    assert pg["Properties"]["Strategy"] == "cluster" and "PlacementGroup" in json.dumps(gang_env["PlacementGroup"])
    (sg_ref,) = gang_env["SecurityGroupIds"]
    sg_id = sg_ref["Fn::GetAtt"][0]
    ingress = [r["Properties"] for r in resources(tpl, "AWS::EC2::SecurityGroupIngress").values()
               if r["Properties"]["GroupId"]["Fn::GetAtt"][0] == sg_id]
    assert [(i["IpProtocol"], i["SourceSecurityGroupId"]["Fn::GetAtt"][0]) for i in ingress] == [("tcp", sg_id)]
    other_envs = [e["Properties"]["ComputeResources"] for k, e in envs.items() if e["Properties"]["ComputeResources"] is not gang_env]
    assert all(sg_id not in json.dumps(e["SecurityGroupIds"]) and "PlacementGroup" not in e for e in other_envs)
    (gang_def,) = [d["Properties"] for d in resources(tpl, "AWS::Batch::JobDefinition").values()
                   if d["Properties"].get("JobDefinitionName") == "gpufleet-gpu-gang"]
    assert gang_def["Type"] == "multinode"
    nodes = gang_def["NodeProperties"]
    assert nodes["MainNode"] == 0 and nodes["NumNodes"] >= 2
    (rng,) = nodes["NodeRangeProperties"]
    assert rng["TargetNodes"] == "0:" and rng["Container"]["Command"] == ["python", "-m", "gpufleet.runtime"]
    assert "RunJobRole" in json.dumps(rng["Container"]["JobRoleArn"])  # the GPU definition's role, no other
    (pool,) = [p for p in DEFAULT_POOLS if p.get("gangs")]
    assert pool["job_queue"] == "gpufleet-gpu-gang" and pool["kind"] == "ondemand"


def test_gpu_image_is_a_docker_asset_built_from_the_repository(assembly_dir):
    from infra.config import STACK_NAME

    images = json.loads((assembly_dir / f"{STACK_NAME}.assets.json").read_text())["dockerImages"]
    (image,) = [i for i in images.values() if i["source"]["dockerFile"] == "gpu_container/Dockerfile"]
    staged = assembly_dir / image["source"]["directory"]
    assert (staged / "gpu_container" / "Dockerfile").is_file() and (staged / "gpufleet").is_dir()
    assert not (staged / ".venv").exists() and not (staged / "tests").exists()


def test_agent_role_limited_to_own_queue_and_the_node_api(tpl):
    (policy,) = [
        r["Properties"]["PolicyDocument"]["Statement"]
        for k, r in resources(tpl, "AWS::IAM::Policy").items()
        if k.startswith("OnPremAgentPolicy")
    ]
    by_sid = {s["Sid"]: s for s in policy}
    queue_arn = json.dumps(by_sid["OwnQueue"]["Resource"])
    assert "gpufleet-node-${aws:PrincipalTag/x509Subject/CN}" in queue_arn
    # its own signal queue (cancel nudges): read and delete only
    assert json.dumps(by_sid["OwnSignals"]["Resource"]).count("gpufleet-node-${aws:PrincipalTag/x509Subject/CN}_signals")
    assert sorted(as_list(by_sid["OwnSignals"]["Action"])) == ["sqs:DeleteMessage", "sqs:ReceiveMessage"]
    # the node API is the node's only way to act on jobs: no DynamoDB, S3 or Step Functions of its own
    assert set(by_sid) == {"OwnQueue", "OwnSignals", "NodeApi"}
    assert as_list(by_sid["NodeApi"]["Action"]) == ["execute-api:Invoke"]
    assert json.dumps(by_sid["NodeApi"]["Resource"]).endswith('/v1/*/v1/node/*"]]}')
    actions = {a for s in policy for a in as_list(s["Action"])}
    assert not {a for a in actions if a.split(":")[0] in ("dynamodb", "s3", "states", "events")}
    # the node-job role (vended per-attempt credentials) is assumed by the node API function only
    (job_role,) = [r for k, r in resources(tpl, "AWS::IAM::Role").items() if k.startswith("OnPremNodeJobRole")]
    (stmt,) = job_role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert "NodeApi" in json.dumps(stmt["Principal"]) and stmt["Action"] == "sts:AssumeRole"
    (job_policy,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in resources(tpl, "AWS::IAM::Policy").items()
                     if k.startswith("OnPremNodeJobPolicy")]
    listing = [s for s in job_policy if "s3:ListBucket" in as_list(s["Action"])]
    assert [s["Condition"] for s in listing] == [{"StringLike": {"s3:prefix": ["jobs/*"]}}]


def test_the_cloud_supervisor_role_is_the_node_apis_to_vend_and_scoped_to_attempt_routes_and_job_objects(tpl):
    (role,) = [r for k, r in resources(tpl, "AWS::IAM::Role").items() if k.startswith("OnPremCloudSupervisorRole")]
    (stmt,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert "NodeApi" in json.dumps(stmt["Principal"]) and stmt["Action"] == "sts:AssumeRole"
    assert role["Properties"]["MaxSessionDuration"] == 3600
    (policy,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in resources(tpl, "AWS::IAM::Policy").items()
                 if k.startswith("OnPremCloudSupervisorPolicy")]
    by_sid = {s["Sid"]: s for s in policy}
    assert set(by_sid) == {"WriteJobObjects", "ReadJobObjectsAndInputs", "ListJobCheckpoints", "ReadPublishedModels",
                           "NodeApiAttempts"}
    assert json.dumps(by_sid["NodeApiAttempts"]["Resource"]).endswith('/v1/POST/v1/node/jobs/*"]]}')
    actions = {a for s in policy for a in as_list(s["Action"])}
    assert not {a for a in actions if a.split(":")[0] in ("dynamodb", "states", "events", "batch", "iam", "sts")}
    # its object scope is exactly the node-job role's (jobs/* objects, tenants' inputs, listing under jobs/)
    (job_policy,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in resources(tpl, "AWS::IAM::Policy").items()
                     if k.startswith("OnPremNodeJobPolicy")]
    assert [s for s in policy if s["Sid"] != "NodeApiAttempts"] == job_policy
    # no Batch task carries it: no job definition in the template names it
    for d in resources(tpl, "AWS::Batch::JobDefinition").values():
        assert "CloudSupervisorRole" not in json.dumps(d)


def _batch_role_policy(tpl, role: str) -> list[dict]:
    (policy,) = [r["Properties"]["PolicyDocument"]["Statement"] for k, r in resources(tpl, "AWS::IAM::Policy").items()
                 if k.startswith(f"Compute{role}DefaultPolicy")]
    return policy


@pytest.mark.parametrize("role", ["RunJobRole", "FinalizeJobRole"])
def test_batch_job_roles_can_make_fenced_writes_and_touch_job_objects(tpl, role):
    policy = _batch_role_policy(tpl, role)
    actions = {a for s in policy for a in as_list(s["Action"])}
    assert {"dynamodb:UpdateItem", "dynamodb:ConditionCheckItem", "s3:PutObject", "s3:GetObject"} <= actions
    assert "dynamodb:DeleteItem" not in actions
    assert ("dynamodb:PutItem" in actions) == (role == "RunJobRole")  # timeline events: run attempts only
    # the only deletes: finalize moving a BLOCKED job's raw output out of jobs/<id>/generated/ (to quarantine/)
    deletes = [s for s in policy if any(a.startswith("s3:Delete") for a in as_list(s["Action"]))]
    if role == "RunJobRole":
        assert deletes == []
        return
    assert [sorted(as_list(s["Action"])) for s in deletes] == [["s3:DeleteObject", "s3:DeleteObjectVersion"]]
    (res,) = as_list(deletes[0]["Resource"])
    assert json.dumps(res).endswith('/jobs/*/generated/*"]]}') and "DataOutputs" in json.dumps(res)


def test_each_batch_job_definition_runs_under_its_own_role(tpl):
    """The GPU definition (generate: a diffusion model on tenants' prompts; container) and the CPU definition
    (finalize: signs with the C2PA key) do not share a role."""
    def role(p: dict) -> str:
        container = p.get("ContainerProperties") or p["NodeProperties"]["NodeRangeProperties"][0]["Container"]
        return container["JobRoleArn"]["Fn::GetAtt"][0]

    defs = {r["Properties"]["JobDefinitionName"]: role(r["Properties"])
            for r in resources(tpl, "AWS::Batch::JobDefinition").values()}
    assert defs["gpufleet-gpu"].startswith("ComputeRunJobRole") and defs["gpufleet-cpu"].startswith("ComputeFinalizeJobRole")
    assert defs["gpufleet-gpu-gang"] == defs["gpufleet-gpu"]  # a gang's nodes run the GPU runtime, as its role


def test_scheduler_outbox_and_webhook_wiring(tpl):
    rules = resources(tpl, "AWS::Events::Rule").values()
    assert any(r["Properties"].get("ScheduleExpression") == "rate(1 minute)" for r in rules)
    assert any(r["Properties"].get("EventPattern", {}).get("source") == ["gpufleet"] for r in rules)
    mappings = [m["Properties"] for m in resources(tpl, "AWS::Lambda::EventSourceMapping").values()]
    stream = [m for m in mappings if "StreamArn" in json.dumps(m["EventSourceArn"])]
    by_filter = {json.loads(m["FilterCriteria"]["Filters"][0]["Pattern"])["eventName"][0]: m for m in stream}
    assert len(stream) == 2 and set(by_filter) == {"INSERT", "MODIFY"}
    fn_ids = {f["Properties"]["Environment"]["Variables"]["GPUFLEET_FUNCTION"]: k
              for k, f in resources(tpl, "AWS::Lambda::Function").items()}
    assert by_filter["INSERT"]["FunctionName"] == {"Ref": fn_ids["outbox"]}
    assert by_filter["MODIFY"]["FunctionName"] == {"Ref": fn_ids["webhook_events"]}
    assert by_filter["MODIFY"]["DestinationConfig"]["OnFailure"]["Destination"]
    api_env = [f["Properties"]["Environment"]["Variables"] for f in resources(tpl, "AWS::Lambda::Function").values()
               if f["Properties"]["Environment"]["Variables"]["GPUFLEET_FUNCTION"] == "api"][0]
    assert {"GPUFLEET_CURSOR_SECRET_ARN", "GPUFLEET_FINALIZE_QUEUE", "GPUFLEET_STATE_MACHINE_ARN"} <= set(api_env)
    # the cursor HMAC key, the C2PA signing key and the watermark keys (test_infra_signing_secret.py)
    assert sorted(k[:-8] for k in resources(tpl, "AWS::SecretsManager::Secret")) == [
        "ComputeSigningSecret", "ComputeWatermarkSecret", "OrchestrationCursorSecret"]
    queues = [q["Properties"] for q in resources(tpl, "AWS::SQS::Queue").values()]
    assert any(q.get("RedrivePolicy", {}).get("maxReceiveCount") == 15 for q in queues)
    assert all(q.get("SqsManagedSseEnabled") for q in queues)


def test_observability_dashboard_and_alarms(tpl):
    (dash,) = resources(tpl, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dash["Properties"]["DashboardBody"])
    for metric in ("PendingJobs", "QueueWaitSeconds", "Placements", "GpuSeconds", "AttemptFailures", "Latency",
                   "5XXError"):
        assert metric in body
    assert len(resources(tpl, "AWS::CloudWatch::Alarm")) >= 6


def _alarm_metrics(alarm: dict) -> list[dict]:
    return [m["MetricStat"]["Metric"] for m in alarm["Properties"].get("Metrics", []) if "MetricStat" in m]


def test_alarms_on_quarantined_finalize_failed_and_every_dlq(tpl):
    alarms = resources(tpl, "AWS::CloudWatch::Alarm")
    pages = {k: a for k, a in alarms.items() if a["Properties"].get("AlarmActions")}
    by_metric = {(a["Properties"].get("MetricName"), json.dumps(a["Properties"].get("Dimensions", []))): a
                 for a in pages.values()}
    quarantined = by_metric[("JobsEnded", json.dumps([{"Name": "Outcome", "Value": "QUARANTINED"}]))]["Properties"]
    assert quarantined["Threshold"] == 1 and quarantined["Namespace"] == "Gpufleet"
    assert by_metric[("FinalizeFailed", "[]")]["Properties"]["Threshold"] == 1
    dlq_alarms = [a for a in pages.values() if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"]
    assert len(dlq_alarms) == 3  # webhook, outbox, webhook-events DLQs
    (node_dlqs,) = [a["Properties"] for a in pages.values()
                    if any('FROM SCHEMA("AWS/SQS"' in m.get("Expression", "") for m in a["Properties"].get("Metrics", []))]
    (query,) = node_dlqs["Metrics"]
    assert "QueueName LIKE 'gpufleet-node-%-dlq'" in query["Expression"] and node_dlqs["Threshold"] == 1
    failed = [a for a in pages.values() if a["Properties"].get("MetricName") == "ExecutionsFailed"]
    assert len(failed) == 1


def test_slo_burn_rate_alarms_are_multi_window(tpl):
    """Queue wait per pool, success rate and API availability: (1 h and 5 min ≥ 14.4) or (6 h and 30 min ≥ 6)."""
    from gpufleet.pools import load_pools

    alarms = resources(tpl, "AWS::CloudWatch::Alarm")
    composites = resources(tpl, "AWS::CloudWatch::CompositeAlarm")
    pools = [p.name for p in load_pools({})]
    assert len(composites) == len(pools) + 2
    for cid, c in composites.items():
        rule = c["Properties"]["AlarmRule"]["Fn::Join"][1]
        members = [p["Fn::GetAtt"][0] for p in rule if isinstance(p, dict)]
        text = "".join(p if isinstance(p, str) else "A" for p in rule)
        assert text == '((ALARM("A") AND ALARM("A")) OR (ALARM("A") AND ALARM("A")))', cid
        windows = []
        for m in members:
            props = alarms[m]["Properties"]
            (expr,) = [x for x in props["Metrics"] if "Expression" in x]
            periods = {x["MetricStat"]["Period"] for x in props["Metrics"] if "MetricStat" in x}
            assert len(periods) == 1 and "AlarmActions" not in props
            windows.append((periods.pop(), props["Threshold"]))
        assert windows == [(3600, 14.4), (300, 14.4), (21600, 6.0), (1800, 6.0)], cid
    queue_slos = [c for c in composites if c.startswith("ObservabilityQueueWaitSlo")]
    assert len(queue_slos) == len(pools)
    stats = {(m["MetricName"], json.dumps(m["Dimensions"])): None for a in alarms.values() for m in _alarm_metrics(a)}
    for pool in pools:
        assert ("QueueWaitSeconds", json.dumps([{"Name": "Pool", "Value": pool}])) in stats
    wait = [x for a in alarms.values() for x in a["Properties"].get("Metrics", [])
            if x.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "QueueWaitSeconds"]
    assert {x["MetricStat"]["Stat"] for x in wait} == {"PR(0:1800)"}
    exprs = [x["Expression"] for a in alarms.values() for x in a["Properties"].get("Metrics", []) if "Expression" in x]
    assert any(e.startswith("((100 - ok) / 100) / 0.05") for e in exprs)  # 95 % within the target
    assert any("/ 0.01" in e and "FILL(ok, 0)" in e for e in exprs)  # success 99 %
    assert any(e == "(FILL(errors, 0) / requests) / 0.001" for e in exprs)  # API 99.9 %


def test_the_execution_ends_failed_when_the_job_does(tpl):
    (sm,) = resources(tpl, "AWS::StepFunctions::StateMachine").values()
    raw = sm["Properties"]["DefinitionString"]
    text = "".join(p if isinstance(p, str) else "X" for p in raw["Fn::Join"][1]) if isinstance(raw, dict) else raw
    states = json.loads(text)["States"]
    assert states["Notify"]["Next"] == "JobEnded"
    ended = states["JobEnded"]
    assert {(c["Variable"], c["StringEquals"], c["Next"]) for c in ended["Choices"]} == {
        ("$.notify.value.status", "FAILED", "JobFailed"), ("$.notify.value.status", "QUARANTINED", "JobQuarantined")}
    assert ended["Default"] == "Done"
    for state, status in (("JobFailed", "FAILED"), ("JobQuarantined", "QUARANTINED")):
        assert states[state]["Type"] == "Fail" and states[state]["Error"] == state
        assert f"the job ended {status} " in states[state]["Cause"]


def test_xray_tracing_on_the_api_the_workflow_and_every_function(tpl):
    """The job's trace (gpufleet.tracing) continues in X-Ray: the API stage, the state machine (the outbox
    starts each execution with the job's traceHeader) and every Lambda trace actively."""
    (stage,) = resources(tpl, "AWS::ApiGateway::Stage").values()
    assert stage["Properties"]["TracingEnabled"] is True
    (sm,) = resources(tpl, "AWS::StepFunctions::StateMachine").values()
    assert sm["Properties"]["TracingConfiguration"] == {"Enabled": True}
    fns = resources(tpl, "AWS::Lambda::Function")
    untraced = [k for k, f in fns.items() if f["Properties"].get("TracingConfig") != {"Mode": "Active"}]
    assert fns and not untraced, untraced


def test_state_machine_has_the_lifecycle_states_and_context_timeouts(tpl):
    from infra.workflow import STATES

    d = definition(tpl)
    assert set(STATES) <= set(d["States"])
    assert d["States"]["RunOnPrem"]["HeartbeatSeconds"] == 3  # from LOCAL_CONTEXT, not the production default
    assert d["States"]["RunCloud"]["Resource"].endswith("batch:submitJob.sync")
    # the attempt's GPUs, vCPUs and memory come from the spec (PrepareRun), not the definition's default of 1 GPU
    overrides = d["States"]["RunCloud"]["Parameters"]["ContainerOverrides"]
    assert overrides["ResourceRequirements.$"] == "$.run.value.resource_requirements"
    # Batch stops the attempt at the spec's max_run_seconds with a margin (PrepareRun), a hung runtime included
    assert d["States"]["RunCloud"]["Parameters"]["Timeout"] == {
        "AttemptDurationSeconds.$": "$.run.value.attempt_duration_seconds"}
    (prepare,) = [f["Properties"]["Environment"]["Variables"] for f in resources(tpl, "AWS::Lambda::Function").values()
                  if f["Properties"]["Environment"]["Variables"].get("GPUFLEET_FUNCTION") == "prepare_run"]
    assert prepare["GPUFLEET_RUN_TIMEOUT_SECONDS"] == "120"  # LOCAL_CONTEXT's run timeout caps it
    (sm,) = resources(tpl, "AWS::StepFunctions::StateMachine").values()
    assert sm["Properties"]["StateMachineType"] == "STANDARD"
    fn_keys = {f.key for f in TASK_FUNCTIONS}
    assert {"check_prompt", "await_placement", "publish", "bill", "notify"} <= fn_keys


def test_cdk_nag_acknowledgements_all_have_reasons(metadata, assembly_dir):
    acks = {
        rule: reason
        for entries in metadata.values()
        for e in entries
        if e["type"] == "aws:cdk:acknowledged-rules"
        for rule, reason in e["data"].items()
    }
    nag = {r: why for r, why in acks.items() if "AwsSolutions-" in r}
    assert len(nag) >= 10
    assert all(isinstance(why, str) and len(why) > 20 for why in nag.values())
    report = json.loads((assembly_dir / "validation-report.json").read_text())
    for plugin in report["pluginReports"]:
        errors = [v for v in plugin["violations"] if v.get("severity") == "error"]
        assert errors == [], plugin["pluginName"]


def test_function_keys_are_unique_and_workflow_keys_present():
    keys = [f.key for f in ALL_FUNCTIONS]
    assert len(keys) == len(set(keys))
    from infra.workflow import REQUIRED_FUNCTIONS

    assert set(REQUIRED_FUNCTIONS) <= {f.key for f in TASK_FUNCTIONS}


def function_envs(tpl: dict) -> dict[str, dict]:
    """``GPUFLEET_FUNCTION`` key -> environment variables of that function."""
    out = {}
    for f in resources(tpl, "AWS::Lambda::Function").values():
        env = f["Properties"].get("Environment", {}).get("Variables", {})
        if "GPUFLEET_FUNCTION" in env:
            out[env["GPUFLEET_FUNCTION"]] = env
    return out


def test_retry_policy_reaches_every_lifecycle_function(tpl):
    from gpufleet.lifecycle.retry import RetryPolicy

    envs = function_envs(tpl)
    for key in [*(f.key for f in TASK_FUNCTIONS if f.key != "finalize"), "outbox"]:
        assert RetryPolicy.model_validate(json.loads(envs[key]["GPUFLEET_RETRY_POLICY"])) == RetryPolicy(), key
    assert "GPUFLEET_RETRY_POLICY" not in envs["finalize"]  # the finalize stage decides no retry


def test_retry_context_keys_build_the_retry_policy_json():
    from gpufleet.lifecycle.retry import RetryPolicy
    from infra.config import InfraConfig

    ctx = {
        "gpufleet:retry_policy": '{"cap_s": 60, "failure_budget": 9}',
        "gpufleet:retry_base_seconds": "0.5",
        "gpufleet:max_failures": "1",
        "gpufleet:quarantine_after_workers": "2",
    }
    policy = RetryPolicy.model_validate(json.loads(InfraConfig.from_context(ctx.get).retry_policy_json()))
    assert (policy.base_s, policy.failure_budget, policy.quarantine_after_workers, policy.cap_s) == (0.5, 1, 2, 60)
    with pytest.raises(ValueError):  # base above the cap: rejected at synth time
        InfraConfig.from_context({"gpufleet:retry_base_seconds": "999", "gpufleet:retry_policy": '{"cap_s": 10}'}.get
                                 ).retry_policy_json()


def function_statements(tpl: dict, key: str) -> list[dict]:
    """Every statement of the inline policies attached to the role of function ``key``."""
    fns = [f for f in resources(tpl, "AWS::Lambda::Function").values()
           if f["Properties"].get("Environment", {}).get("Variables", {}).get("GPUFLEET_FUNCTION") == key]
    (fn,) = fns
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    return [s for p in resources(tpl, "AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def test_classify_failure_may_tag_only_job_checkpoints(tpl):
    (ckpt_id,) = [k for k, b in resources(tpl, "AWS::S3::Bucket").items() if k.startswith("DataCheckpoints")]
    s3 = [s for s in function_statements(tpl, "classify_failure")
          if any(a.startswith("s3:") for a in as_list(s["Action"]))]
    by_action = {a: s for s in s3 for a in as_list(s["Action"])}
    assert set(by_action) == {"s3:GetObjectTagging", "s3:PutObjectTagging", "s3:ListBucket"}
    tag_res = json.dumps(by_action["s3:PutObjectTagging"]["Resource"])
    assert ckpt_id in tag_res and "/jobs/*" in tag_res
    listing = by_action["s3:ListBucket"]
    assert listing["Resource"] == {"Fn::GetAtt": [ckpt_id, "Arn"]}
    assert as_list(listing["Condition"]["StringLike"]["s3:prefix"]) == ["jobs/*"]


def test_api_may_fail_parked_tasks_stop_batch_jobs_and_read_the_cursor_secret(tpl):
    statements = function_statements(tpl, "api")
    actions = {a for s in statements for a in as_list(s["Action"])}
    assert {"states:SendTaskFailure", "batch:TerminateJob", "batch:ListJobs", "secretsmanager:GetSecretValue"} <= actions
    # cancellation fails parked tokens and terminates Batch jobs; it never stops or describes (survey-derived)
    assert not {"states:StopExecution", "batch:DescribeJobs"} & actions
    # the cursor key, no other secret (never the watermark keys: provenance lookups run in a function of their own)
    wanted = {k for k in resources(tpl, "AWS::SecretsManager::Secret") if k.startswith("OrchestrationCursorSecret")}
    reads = [s for s in statements if "secretsmanager:GetSecretValue" in as_list(s["Action"])]
    assert sorted(json.dumps(s["Resource"]) for s in reads) == sorted(json.dumps({"Ref": k}) for k in wanted)
    (terminate,) = [s for s in statements if "batch:TerminateJob" in as_list(s["Action"])]
    assert ":job/*" in json.dumps(terminate["Resource"])


def lambda_functions(tpl: dict) -> dict[str, dict]:
    """``GPUFLEET_FUNCTION`` key -> properties of that function."""
    return {
        f["Properties"]["Environment"]["Variables"]["GPUFLEET_FUNCTION"]: f["Properties"]
        for f in resources(tpl, "AWS::Lambda::Function").values()
        if "GPUFLEET_FUNCTION" in f["Properties"].get("Environment", {}).get("Variables", {})
    }


def test_check_prompt_is_a_container_image_function_from_its_asset(tpl, assembly_dir):
    from infra.config import CHECK_PROMPT_DOCKERFILE, STACK_NAME

    props = lambda_functions(tpl)["check_prompt"]
    assert props["PackageType"] == "Image" and "Handler" not in props and "Runtime" not in props
    assert props["ImageConfig"] == {"Command": ["lambdas.tasks.check_prompt.handler"]}
    assert props["MemorySize"] >= 3008 and props["Architectures"] == ["x86_64"]
    (check_prompt_def,) = [f for f in TASK_FUNCTIONS if f.key == "check_prompt"]
    assert props["Timeout"] == check_prompt_def.timeout_s
    images = json.loads((assembly_dir / f"{STACK_NAME}.assets.json").read_text())["dockerImages"]
    (digest,) = [d for d, i in images.items() if i["source"]["dockerFile"] == CHECK_PROMPT_DOCKERFILE]
    assert images[digest]["source"]["platform"] == "linux/amd64"
    (dest,) = images[digest]["destinations"].values()
    uri = props["Code"]["ImageUri"]["Fn::Sub"]
    assert uri.endswith(f"/{dest['repositoryName']}:{dest['imageTag']}") and dest["imageTag"] == digest


def test_every_other_function_is_a_zip_function_of_the_shared_asset(tpl):
    fns = lambda_functions(tpl)
    assert set(fns) == {f.key for f in ALL_FUNCTIONS}
    keys = set()
    for key, props in fns.items():
        if key in ("check_prompt", "finalize"):  # the container-image functions
            continue
        assert props.get("PackageType", "Zip") == "Zip" and props["Runtime"] == "python3.11", key
        assert props["Handler"] and "ImageConfig" not in props, key
        keys.add(props["Code"]["S3Key"])
    assert len(keys) == 1


def test_the_scheduler_fans_out_to_its_shards(tpl):
    """``scheduler_shards``: one timer rule and one events rule per shard, each invoking the pass with its shard;
    reserved concurrency = the shard count; the default is one shard (the rules' ids unchanged)."""
    def scheduler(t: dict) -> tuple[str, dict]:
        ((lid, fn),) = [(k, f) for k, f in resources(t, "AWS::Lambda::Function").items()
                        if f["Properties"]["Environment"]["Variables"]["GPUFLEET_FUNCTION"] == "scheduler"]
        return lid, fn["Properties"]

    for shards in (1, 3):  # one: the default (the session's template; a synth of its own costs ~15 s of CPU)
        t = tpl if shards == 1 else template(synthesize({f"{CONTEXT_PREFIX}scheduler_shards": shards}))
        lid, fn = scheduler(t)
        assert fn["ReservedConcurrentExecutions"] == shards
        assert fn["Environment"]["Variables"]["GPUFLEET_SCHEDULER_SHARDS"] == str(shards)
        rules = {k: r["Properties"] for k, r in resources(t, "AWS::Events::Rule").items() if k.startswith(
            "OrchestrationScheduler")}
        inputs = sorted((("ScheduleExpression" in r), json.loads(tg["Input"])["shard"])
                        for r in rules.values() for tg in r["Targets"] if tg["Arn"] == {"Fn::GetAtt": [lid, "Arn"]})
        assert inputs == sorted((timer, i) for timer in (False, True) for i in range(shards))
        prefix = "OrchestrationSchedulerTimer"  # + CDK's 8-character hash: shard 0 keeps the unsharded rule's id
        assert sum(k.startswith(prefix) and len(k) == len(prefix) + 8 for k in rules) == 1
        permissions = [p["Properties"] for p in resources(t, "AWS::Lambda::Permission").values()
                       if p["Properties"]["FunctionName"] == {"Fn::GetAtt": [lid, "Arn"]}]
        assert len(permissions) == 2 * shards and all(p["Principal"] == "events.amazonaws.com" for p in permissions)
