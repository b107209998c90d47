"""cdk-nag (AwsSolutions) acknowledgements, each on the narrowest construct and with its reason.

Contract: :func:`acknowledge_findings` is called once the stack is built. Every
acknowledgement names the exact finding (cdk-nag v3 ids such as
``AwsSolutions-IAM5[Resource::...]``) on the construct that raises it, and the
reason is what that construct's policy actually grants (docs/security.md has the
per-role table; tests/infra derives the grants from the code's calls). Synthesis
fails on any finding without an acknowledgement.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import Construct

from infra.config import SIGNALS_SUFFIX, TASK_FUNCTIONS


def ack(scope: Construct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def _arn(stack: Stack, construct: Construct) -> str:
    return f"<{stack.get_logical_id(construct.node.default_child)}.Arn>"


def acknowledge_findings(stack) -> None:  # stack: infra.stack.GpufleetStack (import cycle otherwise)
    data, fns, orch, compute, api, onprem = (
        stack.data,
        stack.functions,
        stack.orchestration,
        stack.compute,
        stack.api,
        stack.onprem,
    )
    ack(
        fns,
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "Write-only CloudWatch Logs permissions for the function's own log group; no data access.",
    )
    ack(
        fns,
        "AwsSolutions-L1",
        "Pinned to Python 3.11: the asset bundles binary wheels (pydantic_core) built for CPython 3.11.",
    )
    # Resource::* on each function role: X-Ray (active tracing) and, for three functions, one more
    # action that IAM cannot scope; no data action is granted on * (tests/infra/test_infra_calls_vs_policy.py).
    extra = {
        "api": " and batch:ListJobs (cancel finds the job's Batch jobs by name)",
        "outbox": " and dynamodb:ListStreams (the jobs-stream event source; returns stream ARNs only)",
        "webhook_events": " and dynamodb:ListStreams (the jobs-stream event source; returns stream ARNs only)",
        "dispatch_cloud": " and batch:DescribeJobDefinitions (finding an image's registered definition)",
    }
    for key, fn in fns.items():
        ack(
            fn,
            "AwsSolutions-IAM5[Resource::*]",
            "xray:PutTraceSegments/PutTelemetryRecords" + extra.get(key, "") + ": actions without resource-level"
            " permissions.",
        )
    jobs_index = f"AwsSolutions-IAM5[Resource::{_arn(stack, data.tables['jobs'])}/index/*]"
    ack(fns["api"], jobs_index, "Query only, on the jobs table's GSIs: tenant/user lists, active and pending counts.")
    ack(fns["scheduler"], jobs_index, "Query only, on the jobs table's pending index (gsi3).")
    ack(fns["api"], f"AwsSolutions-IAM5[Resource::{_arn(stack, data.tables['ledger'])}/index/*]",
        "Query only, on the ledger's tenant index (gsi1): GET /v1/costs reads the caller's tenant's entries.")
    checkpoints = f"AwsSolutions-IAM5[Resource::{_arn(stack, data.checkpoints)}/jobs/*]"
    for key in ("mark_terminal", "publish", "classify_failure"):
        ack(fns[key], checkpoints, "Get/PutObjectTagging under jobs/ only: a terminal job's checkpoints are tagged"
            " so the bucket's lifecycle rule expires them; object keys are per job, created at run time.")
    ack(fns["api"], f"AwsSolutions-IAM5[Resource::{_arn(stack, data.logs)}/jobs/*]",
        "GetObject under jobs/ only: log pages of the caller's job (ownership checked by the API).")
    ack(fns["api"], f"AwsSolutions-IAM5[Resource::{_arn(stack, data.outputs)}/jobs/*]",
        "GetObject(Version) under jobs/ only: presigned output links of the caller's succeeded job.")
    ack(fns["admin_api"], f"AwsSolutions-IAM5[Resource::{_arn(stack, data.models)}/models/*/manifest.json]",
        "GetObject of published models' manifests only (models/<name>/manifest.json): a model registration records "
        "the manifest's hash (the model catalog); never the model files, no listing, no writes.")
    ack(fns["provenance_lookup"], f"AwsSolutions-IAM5[Resource::{_arn(stack, data.outputs)}/jobs/*]",
        "GetObject under jobs/ only: presigned links to the manifest (and, to its own tenant, the video) of a job "
        "whose watermark a lookup found (the index names the keys).")
    ack(
        fns["api"],
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:batch:<AWS::Region>:<AWS::AccountId>:job/*]",
        "Cancel terminates the job's Batch jobs, whose ids are known only at run time.",
    )
    node_queues = "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:" + (
        f"{stack.config.node_queue_prefix}*]"
    )
    ack(fns["register_node"], node_queues, "Creates and configures the per-node queues at registration, under this"
        " name prefix only.")
    ack(fns["dispatch_onprem"], node_queues, "RunOnPrem's dispatch sends the attempt (without its task token) to"
        " the placed node's queue, one of the per-node queues under this prefix; the queue must be the one the"
        " attempt item's placement names (gpufleet.nodeapi.dispatch).")
    ack(fns["api"], node_queues[:-2] + f"*{SIGNALS_SUFFIX}]", "Cancel sends a cancelled on-prem job's node a nudge"
        " on its signal queue (named at registration); signal queues only, never a node's work queue.")
    ack(fns["dispatch_cloud"], "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:batch:<AWS::Region>:"
        f"<AWS::AccountId>:job-definition/{stack.config.name('tenant')}-*]",
        "RunCloudContainer's dispatch registers (tagged) and submits with one definition per tenant image digest, "
        "named under this prefix only and created at run time (gpufleet.batchdef.definition_name).")
    ack(compute.tenant_execution_role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ecr:<AWS::Region>:"
        "<AWS::AccountId>:repository/*]",
        "Cloud container jobs run the tenants' images by digest, from this account's repositories (named by the "
        "jobs at run time): image pull only.")
    if orch.state_machine is not None:
        ack(
            orch.state_machine,
            "AwsSolutions-SF1",
            "Logs ERROR events only, without execution data: the state carries prompts, container env and task"
            " tokens, which must not sit in CloudWatch Logs; X-Ray and the execution history keep the trace.",
        )
        for f in TASK_FUNCTIONS:
            ack(
                orch.state_machine,
                f"AwsSolutions-IAM5[Resource::{_arn(stack, fns[f.key])}:*]",
                "Invoke of this task function's versions and aliases (CDK LambdaInvoke grant).",
            )
        ack(
            orch.state_machine,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray and CloudWatch Logs vended delivery and batch:DescribeJobs (RunCloudGang's poll), which have no"
            " resource-level permissions; batch:SubmitJob names the platform's queues and job definitions.",
        )
        ack(
            orch.state_machine,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:batch:<AWS::Region>:<AWS::AccountId>:job/*]",
            "StopGang terminates the gang's multi-node parallel job past the run timeout; its id is known only at run"
            " time.",
        )
    ack(
        orch.cursor_secret,
        "AwsSolutions-SMG4",
        "HMAC key of list cursors: rotating it only invalidates open cursors; rotate by redeploying.",
    )
    ack(
        compute.signing_secret,
        "AwsSolutions-SMG4",
        "The C2PA signing key is issued with its certificate by the operator's CA; it is rotated by storing a new "
        "key and chain (put-secret-value), which Secrets Manager rotation cannot do.",
    )
    ack(
        compute.watermark_secret,
        "AwsSolutions-SMG4",
        "Watermark keys must stay detectable for as long as their videos circulate: a rotation adds a key first and "
        "keeps the old ones (put-secret-value, docs/operations.md); replacing the value on a schedule would orphan "
        "every earlier video's mark.",
    )
    ack(orch.outbox_dlq, "AwsSolutions-SQS3", "This queue is itself the outbox dead-letter queue.")
    ack(orch.webhook_events_dlq, "AwsSolutions-SQS3", "This queue is itself the webhook-events dead-letter queue.")
    ack(
        compute,
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSBatchServiceRole]",
        "The AWS Batch service role policy, maintained by AWS for the Batch service itself.",
    )
    ack(
        compute,
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role]",
        "ECS container-instance role required by Batch EC2 compute environments; jobs use their own job role.",
    )
    for bucket in (data.outputs, data.checkpoints, data.logs):
        ack(compute.run_job_role, f"AwsSolutions-IAM5[Resource::{_arn(stack, bucket)}/jobs/*]",
            "The runtime reads and writes its job's objects under jobs/<job_id>/ (keys created at run time).")
    models = (f"AwsSolutions-IAM5[Resource::{_arn(stack, data.models)}/models/*]",
              "GetObject only of the published models (models/<name>/manifest.json and its files, named by the job's "
              "spec): platform content any run attempt may read; operators publish with their own credentials.")
    ack(compute.run_job_role, *models)
    # the finalize stage's two roles (the CPU Batch job's, FinalizeLambda's) hold the same grants
    for finalize_role in (compute.finalize_job_role, stack.functions["finalize"].role):
        for bucket in (data.outputs, data.logs):
            ack(finalize_role, f"AwsSolutions-IAM5[Resource::{_arn(stack, bucket)}/jobs/*]",
                "Finalize reads its job's generated output and writes its video and logs under jobs/<job_id>/.")
        ack(finalize_role, f"AwsSolutions-IAM5[Resource::{_arn(stack, data.outputs)}/quarantine/jobs/*]",
            "Finalize moves a BLOCKED job's raw output to quarantine/jobs/<job_id>/ (keys created at run time).")
        ack(finalize_role, f"AwsSolutions-IAM5[Resource::{_arn(stack, data.outputs)}/jobs/*/generated/*]",
            "Finalize deletes the moved version of a BLOCKED job's raw output, jobs/<job_id>/generated/ only.")
    ack(
        compute,
        "AwsSolutions-IAM5[Resource::*]",
        "ecr:GetAuthorizationToken (pulling the GPU image) supports no resource scoping.",
    )
    ack(
        api,
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
        "Account-level role that lets API Gateway write the stage's access and execution logs.",
    )
    ack(api, "AwsSolutions-APIG2", "The API Lambda validates every request body and parameter with pydantic.")
    ack(api, "AwsSolutions-APIG3", "Every method requires SigV4 (AWS_IAM); stage throttling limits abuse.")
    ack(api, "AwsSolutions-COG4", "Callers authenticate with SigV4 (AWS_IAM), not Cognito user pools.")
    ack(onprem.agent_policy, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
        f"<AWS::AccountId>:<{stack.get_logical_id(api.rest_api.node.default_child)}>/v1/*/v1/node/*]",
        "Invoke of the node API's routes only (/v1/node/*, any method): the node's one way to act on jobs; the"
        " server checks each call's attempt is this node's at the current epoch.")
    api_id = f"<AWS::AccountId>:<{stack.get_logical_id(api.rest_api.node.default_child)}>"
    admin = stack.admin
    ack(admin.admin_policy, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
        f"{api_id}/v1/*/v1/admin/*]",
        "Invoke of the administration API's routes only (any method, any stage path under /v1/admin/); the API"
        " itself admits admin principals only.")
    from infra.api import TENANT_PATHS

    for path in TENANT_PATHS:
        ack(admin.tenant_policy, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
            f"{api_id}/v1/*{path}]",
            "Invoke of the jobs API (any method of these paths); the API scopes every job to the caller's tenant.")
    if stack.console is not None:
        from infra.console import acknowledge

        acknowledge(stack.console, api_id)
    object_bounds = {
        onprem.node_job_policy: "the per-attempt credentials the node API vends: every session is narrowed by its"
        " session policy to jobs/<job_id>/ of the one job (gpufleet.nodeapi.scope).",
        onprem.supervisor_policy: "a cloud supervisor's sessions, vended by the node API only: each is narrowed by"
        " its session policy to jobs/<job_id>/ of its one attempt's job (gpufleet.nodeapi.supervisor).",
    }
    for policy, bound in object_bounds.items():
        for bucket in (data.checkpoints, data.outputs, data.logs):
            ack(policy, f"AwsSolutions-IAM5[Resource::{_arn(stack, bucket)}/jobs/*]", "The bound of " + bound)
        ack(policy, f"AwsSolutions-IAM5[Resource::{_arn(stack, data.outputs)}/tenants/*]",
            "Reads of the job's declared inputs (tenants/<tenant>/...); each session policy names the job's inputs.")
        ack(policy, *models)
    ack(onprem.supervisor_policy, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
        f"{api_id}/v1/POST/v1/node/jobs/*]",
        "Invoke of the node API's attempt routes only; each supervisor session's policy names its one attempt's"
        " routes (POST /v1/node/jobs/<job>/attempts/<epoch>/*) and the server checks the session is that attempt's.")

