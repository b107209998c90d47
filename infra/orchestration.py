"""Orchestration construct: the state machine, the scheduler triggers, the outbox and webhooks.

Contract:
- ``self.state_machine``: Standard, built by ``infra.workflow.build_definition``
  (see infra/resources.py), logging ALL events to CloudWatch Logs, X-Ray on.
- The scheduler pass Lambda runs on a schedule (``rate(scheduler_rate_minutes)``)
  and on EventBridge events from source ``gpufleet`` with detail types
  ``SCHEDULER_TRIGGER_EVENTS`` on the app's bus; reserved concurrency 1 keeps
  one pass at a time.
- The outbox Lambda consumes the jobs table stream (INSERT records only) and
  starts executions; failed batches go to a DLQ.
- The webhook sender consumes ``self.webhook_queue`` (partial batch failures;
  SQS redelivery with the handler's visibility back-off); after
  ``webhook_max_receives`` tries a message moves to ``self.webhook_dlq``.
- Every grant is least privilege for the function that needs it.
"""

from __future__ import annotations

import importlib.util

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.compute import Compute
from infra.config import EVENT_SOURCE, SCHEDULER_TRIGGER_EVENTS, TASK_FUNCTIONS, InfraConfig
from infra.data import Data
from infra.functions import Functions

#: Functions that build ``gpufleet.lifecycle.settings.Deps`` (and so read ``GPUFLEET_RETRY_POLICY``).
RETRY_POLICY_FUNCTIONS = frozenset({*(f.key for f in TASK_FUNCTIONS), "outbox"})


def workflow_available() -> bool:
    """Whether the lifecycle's ``infra/workflow.py`` is present in this checkout."""
    return importlib.util.find_spec("infra.workflow") is not None


def _queue(scope: Construct, cid: str, **kwargs) -> sqs.Queue:
    return sqs.Queue(scope, cid, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True, **kwargs)


class Orchestration(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        config: InfraConfig,
        data: Data,
        compute: Compute,
        functions: Functions,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        self.node_queue_arn_pattern = stack.format_arn(
            service="sqs", resource=f"{config.node_queue_prefix}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )
        self.bus = events.EventBus(self, "Bus", event_bus_name=config.name("events"))

        # Webhooks: queue + DLQ, consumed by the sender.
        self.webhook_dlq = _queue(self, "WebhookDlq", retention_period=Duration.days(14))
        self.webhook_queue = _queue(
            self,
            "WebhookQueue",
            visibility_timeout=Duration.seconds(6 * functions["webhook"].timeout.to_seconds()),
            retention_period=Duration.hours(config.webhook_retention_hours),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=config.webhook_max_receives, queue=self.webhook_dlq),
        )
        functions["webhook"].add_event_source(
            sources.SqsEventSource(self.webhook_queue, batch_size=10, report_batch_item_failures=True)
        )

        # Outbox: the jobs stream starts workflows.
        self.outbox_dlq = _queue(self, "OutboxDlq", retention_period=Duration.days(14))
        jobs = data.tables["jobs"]
        functions["outbox"].add_event_source(
            sources.DynamoEventSource(
                jobs,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=50,
                bisect_batch_on_error=True,
                retry_attempts=10,
                report_batch_item_failures=True,
                on_failure=sources.SqsDlq(self.outbox_dlq),
                filters=[lambda_.FilterCriteria.filter({"eventName": lambda_.FilterRule.is_equal("INSERT")})],
            )
        )

        # Webhook events: MODIFY records of the jobs stream queue "started"/"progress" webhooks (the
        # terminal events come from the workflow's Notify task).
        self.webhook_events_dlq = _queue(self, "WebhookEventsDlq", retention_period=Duration.days(14))
        functions["webhook_events"].add_event_source(
            sources.DynamoEventSource(
                jobs,
                starting_position=lambda_.StartingPosition.LATEST,
                batch_size=50,
                bisect_batch_on_error=True,
                retry_attempts=5,
                report_batch_item_failures=True,
                on_failure=sources.SqsDlq(self.webhook_events_dlq),
                filters=[lambda_.FilterCriteria.filter({"eventName": lambda_.FilterRule.is_equal("MODIFY")})],
            )
        )

        # Scheduler: on a timer and on events, one pass at a time.
        scheduler = functions["scheduler"]
        scheduler.node.default_child.reserved_concurrent_executions = 1
        events.Rule(
            self,
            "SchedulerTimer",
            schedule=events.Schedule.rate(Duration.minutes(config.scheduler_rate_minutes)),
            targets=[targets.LambdaFunction(scheduler)],
        )
        events.Rule(
            self,
            "SchedulerOnEvents",
            event_bus=self.bus,
            event_pattern=events.EventPattern(source=[EVENT_SOURCE], detail_type=list(SCHEDULER_TRIGGER_EVENTS)),
            targets=[targets.LambdaFunction(scheduler)],
        )

        self.state_machine: sfn.StateMachine | None = None
        if workflow_available():
            self.state_machine = self._state_machine(config, data, compute, functions, log_retention)
        self._grant(config, data, compute, functions)

    def _state_machine(self, config, data, compute, functions, log_retention) -> sfn.StateMachine:
        from infra.workflow import FinalizeTarget, WorkflowTimeouts, build_definition

        timeouts = WorkflowTimeouts(
            heartbeat_seconds=config.heartbeat_seconds,
            placement_timeout_seconds=config.placement_timeout_seconds,
            run_timeout_seconds=config.run_timeout_seconds,
            finalize_timeout_seconds=config.finalize_timeout_seconds,
            finalize_retry_interval_seconds=config.finalize_retry_interval_seconds,
            finalize_max_attempts=config.finalize_max_attempts,
        )
        definition = build_definition(
            self,
            functions.subset(f.key for f in TASK_FUNCTIONS),
            FinalizeTarget(
                job_queue=compute.cpu_queue.job_queue_arn,
                job_definition=compute.cpu_job_definition.job_definition_arn,
            ),
            timeouts,
            node_queue_prefix=config.node_queue_prefix,
            node_queue_arn=self.node_queue_arn_pattern,
        )
        log_group = logs.LogGroup(self, "WorkflowLogs", retention=log_retention)
        machine = sfn.StateMachine(
            self,
            "Workflow",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            tracing_enabled=True,
        )
        machine.add_to_role_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.node_queue_arn_pattern])
        )
        machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["batch:SubmitJob"],
                resources=[
                    compute.gpu_spot_queue.job_queue_arn,
                    compute.gpu_ondemand_queue.job_queue_arn,
                    compute.cpu_queue.job_queue_arn,
                    compute.gpu_job_definition.job_definition_arn,
                    compute.cpu_job_definition.job_definition_arn,
                ],
            )
        )
        return machine

    def _grant(self, config: InfraConfig, data: Data, compute: Compute, functions: Functions) -> None:
        tables: dict[str, ddb.Table] = data.tables
        retry_policy = config.retry_policy_json()
        for key, fn in functions.items():
            fn.add_environment("GPUFLEET_EVENT_BUS", self.bus.event_bus_name)
            fn.add_environment("GPUFLEET_WEBHOOK_QUEUE_URL", self.webhook_queue.queue_url)
            fn.add_environment("GPUFLEET_NODE_QUEUE_PREFIX", config.node_queue_prefix)
            fn.add_environment("GPUFLEET_HEARTBEAT_SECONDS", str(config.heartbeat_seconds))
            if key in RETRY_POLICY_FUNCTIONS:
                fn.add_environment("GPUFLEET_RETRY_POLICY", retry_policy)
            if config.billing_policy:
                fn.add_environment("GPUFLEET_BILLING_POLICY", config.billing_policy)
            if config.webhook_allow_private and key in ("api", "webhook"):  # local development only
                fn.add_environment("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")
            if self.state_machine is not None and key in ("api", "outbox"):
                fn.add_environment("GPUFLEET_STATE_MACHINE_ARN", self.state_machine.state_machine_arn)
            if key in ("register_node", "webhook_events"):  # no table access (the stream grant suffices)
                continue
            for table in tables.values():
                table.grant_read_write_data(fn)
        for key in ("await_placement", "mark_terminal", "classify_failure", "api"):
            self.bus.grant_put_events_to(functions[key])
        for key in ("notify", "api", "webhook_events"):
            self.webhook_queue.grant_send_messages(functions[key])
        data.outputs.grant_read_write(functions["publish"])
        data.checkpoints.grant_read(functions["publish"])
        # Terminal writers tag the job's checkpoints (gpufleet.store.objects.mark_checkpoints_ended): list the job's prefix,
        # read and write object tags there, nothing else of the bucket.
        for key in ("mark_terminal", "publish", "classify_failure"):
            functions[key].add_to_role_policy(
                iam.PolicyStatement(
                    actions=["s3:PutObjectTagging", "s3:GetObjectTagging"],
                    resources=[data.checkpoints.arn_for_objects("jobs/*")],
                )
            )
            functions[key].add_to_role_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[data.checkpoints.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": ["jobs/*"]}},
                )
            )
        for key in ("mark_terminal", "publish"):
            data.checkpoints.grant_read(functions[key])
        for bucket in (data.outputs, data.logs):
            bucket.grant_read(functions["api"])
        if self.state_machine is not None:
            self.state_machine.grant_start_execution(functions["outbox"])
            self.state_machine.grant_task_response(functions["scheduler"])
            self.state_machine.grant_task_response(functions["api"])
            self.state_machine.grant_read(functions["api"])
            functions["api"].add_to_role_policy(
                iam.PolicyStatement(
                    actions=["states:StopExecution"],
                    resources=[
                        Stack.of(self).format_arn(
                            service="states",
                            resource="execution",
                            resource_name=f"{self.state_machine.state_machine_name}:*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    ],
                )
            )
        # Batch jobs (the runtime, both stages): fenced writes on job and attempt items, job objects.
        jobs_table = tables["jobs"]
        # PutItem: the timeline event written with the worker's fenced SCHEDULED -> RUNNING move.
        jobs_table.grant(
            compute.job_role, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem", "dynamodb:PutItem"
        )
        for bucket in (data.outputs, data.checkpoints, data.logs):
            bucket.grant_read(compute.job_role, "jobs/*")
            bucket.grant_put(compute.job_role, "jobs/*")
        # Cancel terminates the job's Batch jobs: TerminateJob is scoped to job ARNs, List/Describe have no
        # resource-level permissions.
        stack = Stack.of(self)
        functions["api"].add_to_role_policy(
            iam.PolicyStatement(
                actions=["batch:TerminateJob"],
                resources=[stack.format_arn(service="batch", resource="job", resource_name="*")],
            )
        )
        functions["api"].add_to_role_policy(
            iam.PolicyStatement(actions=["batch:ListJobs", "batch:DescribeJobs"], resources=["*"])
        )
        functions["api"].add_environment("GPUFLEET_FINALIZE_QUEUE", compute.cpu_queue.job_queue_name)
        # HMAC key of the API's list cursors (gpufleet.api.settings: cursor_secret_arn).
        self.cursor_secret = secretsmanager.Secret(
            self,
            "CursorSecret",
            description="HMAC key of gpufleet API list cursors (rotating it invalidates open cursors)",
            generate_secret_string=secretsmanager.SecretStringGenerator(password_length=48, exclude_punctuation=True),
        )
        self.cursor_secret.grant_read(functions["api"])
        functions["api"].add_environment("GPUFLEET_CURSOR_SECRET_ARN", self.cursor_secret.secret_arn)
