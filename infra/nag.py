"""cdk-nag (AwsSolutions) acknowledgements, each on the narrowest construct and with its reason.

Contract: :func:`acknowledge_findings` is called once the stack is built. Every
acknowledgement names the exact finding (cdk-nag v3 ids such as
``AwsSolutions-IAM5[Resource::...]``) and a reason; ``tests/infra`` checks that
the synthesized validation report has no unacknowledged error and that every
acknowledgement carries a reason.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import Construct

from infra.config import TASK_FUNCTIONS


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
        "AwsSolutions-IAM5[Resource::*]",
        "X-Ray PutTraceSegments/PutTelemetryRecords and Batch ListJobs/DescribeJobs support no resource scoping.",
    )
    ack(
        fns,
        "AwsSolutions-L1",
        "Pinned to Python 3.11: the asset bundles binary wheels (pydantic_core) built for CPython 3.11.",
    )
    for table in data.tables.values():
        ack(
            fns,
            f"AwsSolutions-IAM5[Resource::{_arn(stack, table)}/index/*]",
            "Queries on the table's own GSIs (declared in gpufleet/store/schema.py).",
        )
    for rule in ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*"):
        ack(fns, f"AwsSolutions-IAM5[{rule}]", "CDK read grant on the job data buckets of this stack only.")
    for rule in ("Action::s3:DeleteObject*", "Action::s3:Abort*"):
        ack(fns["publish"], f"AwsSolutions-IAM5[{rule}]", "Publish replaces and cleans up its own output objects.")
    for bucket in (data.outputs, data.checkpoints, data.logs):
        for suffix in ("/*", "/jobs/*"):
            ack(
                stack,
                f"AwsSolutions-IAM5[Resource::{_arn(stack, bucket)}{suffix}]",
                "Object keys are per job (jobs/<job_id>/...) and created at runtime; scoped to this bucket.",
            )
    ack(
        fns["api"],
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:"
        f"{{\"Fn::Select\":[6,{{\"Fn::Split\":[\":\",{{\"Ref\":\"{stack.get_logical_id(orch.state_machine.node.default_child)}\"}}]}}]}}:*]"
        if orch.state_machine is not None
        else "AwsSolutions-IAM5[Resource::none]",
        "Executions of this state machine only (names are job ids, created at runtime).",
    )
    if orch.state_machine is not None:
        ack(
            orch.state_machine,
            "AwsSolutions-SF1",
            "Logs ERROR events only, without execution data: the state carries prompts, container env and task"
            " tokens, which must not sit in CloudWatch Logs; X-Ray and the execution history keep the trace.",
        )
        sm_id = stack.get_logical_id(orch.state_machine.node.default_child)
        ack(
            fns["api"],
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:"
            f"<{sm_id}.Name>:*]",
            "Executions of this state machine only (names are job ids, created at runtime).",
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
            "X-Ray, CloudWatch Logs delivery and (RunCloud, whose queue comes from the placement at run time)"
            " batch:SubmitJob support no narrower resource here; Batch queues hold no data.",
        )
        ack(
            orch.state_machine,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:batch:<AWS::Region>:<AWS::AccountId>:job-definition/*]",
            "RunCloud submits the job definition chosen by the placement (revisions change at deploy).",
        )
    ack(
        fns["api"],
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:batch:<AWS::Region>:<AWS::AccountId>:job/*]",
        "Cancel terminates the job's Batch jobs, whose ids are known only at run time.",
    )
    ack(
        orch.cursor_secret,
        "AwsSolutions-SMG4",
        "HMAC key of list cursors: rotating it only invalidates open cursors; rotate by redeploying.",
    )
    node_queues = "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:" + (
        f"{stack.config.node_queue_prefix}*]"
    )
    ack(stack, node_queues, "Per-node queues are created at registration time under this name prefix.")
    ack(orch.outbox_dlq, "AwsSolutions-SQS3", "This queue is itself the outbox dead-letter queue.")
    ack(orch.webhook_dlq, "AwsSolutions-SQS3", "This queue is itself the webhook dead-letter queue.")
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
    ack(
        compute.job_role,
        f"AwsSolutions-IAM5[Resource::{_arn(stack, data.tables['jobs'])}/index/*]",
        "CDK table grants include the table's GSIs; the job role only gets/updates items (fenced).",
    )
    for rule in ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*", "Action::s3:Abort*"):
        ack(compute.job_role, f"AwsSolutions-IAM5[{rule}]", "CDK read/put grants on job objects (jobs/*) only.")
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
    ack(
        onprem.agent_policy,
        "AwsSolutions-IAM5[Resource::*]",
        "SendTaskHeartbeat/Success/Failure act on task tokens and support no resource scoping.",
    )
