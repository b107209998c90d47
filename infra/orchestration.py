"""Orchestration construct: the state machine, the scheduler triggers, the outbox and webhooks.

Contract:
- ``self.state_machine``: Standard, built by ``infra.workflow.build_definition``,
  logging ERROR events to CloudWatch Logs without execution data (states carry prompts,
  container env and task tokens), X-Ray on.
- The scheduler pass Lambda runs on a schedule (``rate(scheduler_rate_minutes)``)
  and on EventBridge events from source ``gpufleet`` with detail types
  ``SCHEDULER_TRIGGER_EVENTS`` on the app's bus, fanned out to its ``scheduler_shards`` shards: one timer rule
  and one events rule per shard, each with the input ``{"shard": i}`` (EventBridge invokes the function
  asynchronously, so the shards run side by side); reserved concurrency = the shard count (each shard's lease
  keeps one pass per shard at a time). No role of its own is needed: each rule is allowed to invoke the function
  by the function's resource policy.
- The outbox Lambda consumes the jobs table stream (INSERT records, and MODIFY records of jobs with a
  ``workflow_run``: operator recovery, gpufleet.lifecycle.recovery) and
  starts executions; failed batches go to a DLQ.
- The webhook sender consumes ``self.webhook_queue`` (partial batch failures;
  SQS redelivery with the handler's visibility back-off); after
  ``webhook_max_receives`` tries a message moves to ``self.webhook_dlq``.
- Every grant is least privilege for the function that needs it: data grants per table, action
  and key prefix come from infra/grants.py; the state machine may submit Batch jobs only to the
  platform's queues and definitions.
"""

from __future__ import annotations

import importlib.util

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.compute import Compute
from infra.config import EVENT_SOURCE, SCHEDULER_TRIGGER_EVENTS, SIGNALS_SUFFIX, TASK_FUNCTIONS, InfraConfig
from infra.data import MODELS_PREFIX, Data
from infra.functions import Functions
from infra.grants import (
    EVENT_ATTRIBUTES,
    FINALIZE_ATTRIBUTES,
    JOB,
    RUN_JOB_ATTRIBUTES,
    grant_data,
    immutable_job_denial,
)

#: Functions that build ``gpufleet.lifecycle.settings.Deps`` (and so read ``GPUFLEET_RETRY_POLICY``).
RETRY_POLICY_FUNCTIONS = frozenset({*(f.key for f in TASK_FUNCTIONS), "outbox"} - {"finalize"})


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
        #: the nodes' signal queues (cancel nudges, gpufleet.store.queues): the API alone sends there
        self.signal_queue_arn_pattern = stack.format_arn(
            service="sqs", resource=f"{config.node_queue_prefix}*{SIGNALS_SUFFIX}", arn_format=ArnFormat.NO_RESOURCE_NAME
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
                filters=[
                    lambda_.FilterCriteria.filter({"eventName": lambda_.FilterRule.is_equal("INSERT")}),
                    # an operator's recovery action bumps workflow_run: a new run of the job's workflow
                    lambda_.FilterCriteria.filter({
                        "eventName": lambda_.FilterRule.is_equal("MODIFY"),
                        "dynamodb": {"NewImage": {"workflow_run": {"N": lambda_.FilterRule.exists()}}},
                    }),
                ],
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

        # Scheduler: on a timer and on events, one pass per shard at a time, the shards side by side.
        scheduler = functions["scheduler"]
        shards = config.scheduler_shards
        scheduler.node.default_child.reserved_concurrent_executions = shards
        # the queue view's estimated starts assume one pass per timer period
        scheduler.add_environment("GPUFLEET_SCHEDULER_INTERVAL_S", str(60 * config.scheduler_rate_minutes))
        scheduler.add_environment("GPUFLEET_SCHEDULER_SHARDS", str(shards))
        for shard in range(shards):
            suffix = "" if shard == 0 else str(shard)  # shard 0 keeps the unsharded rules' ids
            target = targets.LambdaFunction(scheduler, event=events.RuleTargetInput.from_object({"shard": shard}))
            events.Rule(
                self,
                f"SchedulerTimer{suffix}",
                schedule=events.Schedule.rate(Duration.minutes(config.scheduler_rate_minutes)),
                targets=[target],
            )
            events.Rule(
                self,
                f"SchedulerOnEvents{suffix}",
                event_bus=self.bus,
                event_pattern=events.EventPattern(source=[EVENT_SOURCE], detail_type=list(SCHEDULER_TRIGGER_EVENTS)),
                targets=[target],
            )

        self.state_machine: sfn.StateMachine | None = None
        if workflow_available():
            self.state_machine = self._state_machine(config, data, compute, functions, log_retention)
        self._grant(config, data, compute, functions)

    def _state_machine(self, config, data, compute, functions, log_retention) -> sfn.StateMachine:
        from infra.workflow import CloudTarget, FinalizeTarget, WorkflowTimeouts, build_definition

        timeouts = WorkflowTimeouts(
            heartbeat_seconds=config.heartbeat_seconds,
            cloud_heartbeat_seconds=config.cloud_heartbeat_seconds,
            placement_timeout_seconds=config.placement_timeout_seconds,
            run_timeout_seconds=config.run_timeout_seconds,
            finalize_timeout_seconds=config.finalize_timeout_seconds,
            finalize_retry_interval_seconds=config.finalize_retry_interval_seconds,
            finalize_max_attempts=config.finalize_max_attempts,
            finalize_retry_backoff_rate=config.finalize_retry_backoff_rate,
            finalize_lambda_max_pixels=config.finalize_lambda_max_pixels,
        )
        definition = build_definition(
            self,
            functions.subset(f.key for f in TASK_FUNCTIONS),
            FinalizeTarget(
                job_queue=compute.cpu_queue.job_queue_arn,
                job_definition=compute.cpu_job_definition.job_definition_arn,
            ),
            timeouts,
            cloud=CloudTarget(
                spot_queue_name=config.name("gpu-spot"),
                spot_queue_arn=compute.gpu_spot_queue.job_queue_arn,
                ondemand_queue_name=config.name("gpu-ondemand"),
                ondemand_queue_arn=compute.gpu_ondemand_queue.job_queue_arn,
                job_definition=compute.gpu_job_definition.job_definition_arn,
                gang_queue_name=config.name("gpu-gang"),
                gang_queue_arn=compute.gpu_gang_queue.job_queue_arn,
                gang_job_definition=compute.gpu_gang_job_definition.job_definition_arn,
                gang_poll_seconds=config.gang_poll_seconds,
            ),
            node_queue_prefix=config.node_queue_prefix,
            node_queue_arn=self.node_queue_arn_pattern,
        )
        log_group = logs.LogGroup(self, "WorkflowLogs", retention=log_retention)
        machine = sfn.StateMachine(
            self,
            "Workflow",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            # errors only, without execution data: states carry prompts, container env and task tokens
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ERROR, include_execution_data=False),
            tracing_enabled=True,
        )
        # RunCloud, RunCloudGang and FinalizeStage (ASL, no generated statements): the platform's four queues and
        # three definitions, nothing else; .sync tracks the job through the managed Batch events rule.
        machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["batch:SubmitJob"],
                resources=[
                    compute.gpu_spot_queue.job_queue_arn,
                    compute.gpu_ondemand_queue.job_queue_arn,
                    compute.gpu_gang_queue.job_queue_arn,
                    compute.cpu_queue.job_queue_arn,
                    compute.gpu_job_definition.job_definition_arn,
                    compute.gpu_gang_job_definition.job_definition_arn,
                    compute.cpu_job_definition.job_definition_arn,
                ],
            )
        )
        # RunCloudGang's poll loop: DescribeJobs has no resource-level permissions; StopGang terminates the gang's
        # job past the run timeout (jobs of this account and region).
        machine.add_to_role_policy(iam.PolicyStatement(actions=["batch:DescribeJobs"], resources=["*"]))
        machine.add_to_role_policy(iam.PolicyStatement(
            actions=["batch:TerminateJob"], resources=[Stack.of(self).format_arn(service="batch", resource="job",
                                                                               resource_name="*")]))
        machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[
                    Stack.of(self).format_arn(
                        service="events", resource="rule", resource_name="StepFunctionsGetEventsForBatchJobsRule"
                    )
                ],
            )
        )
        return machine

    def _grant_cloud_dispatch(self, config: InfraConfig, compute: Compute, fn: lambda_.Function) -> None:
        """RunCloudContainer's dispatch (gpufleet.nodeapi.cloud_dispatch): it registers ``<prefix>-tenant-*``
        definitions (tagged: TagResource), finds them (DescribeJobDefinitions has no resource-level permission),
        submits to the GPU queues with them only, and passes the tenant execution role (image pull and logs) to
        them, no other role. Its settings: the supervisor image, that role, the log group, the run timeout (the node
        API's URL is set by the stack, infra/stack.py)."""
        stack = Stack.of(self)
        tenant_defs = stack.format_arn(service="batch", resource="job-definition",
                                       resource_name=f"{config.name('tenant')}-*")
        queues = [q.job_queue_arn for q in compute.gpu_queues.values()]
        fn.add_to_role_policy(iam.PolicyStatement(actions=["batch:SubmitJob"], resources=[*queues, tenant_defs]))
        fn.add_to_role_policy(iam.PolicyStatement(actions=["batch:RegisterJobDefinition", "batch:TagResource"],
                                                  resources=[tenant_defs]))
        fn.add_to_role_policy(iam.PolicyStatement(actions=["batch:DescribeJobDefinitions"], resources=["*"]))
        fn.add_to_role_policy(iam.PolicyStatement(actions=["iam:PassRole"],
                                                  resources=[compute.tenant_execution_role.role_arn]))
        for name, value in (("GPUFLEET_PREFIX", config.prefix),
                            ("GPUFLEET_SUPERVISOR_IMAGE", compute.runtime_image_uri),
                            ("GPUFLEET_TENANT_EXECUTION_ROLE_ARN", compute.tenant_execution_role.role_arn),
                            ("GPUFLEET_TENANT_LOG_GROUP", compute.job_log_group.log_group_name),
                            ("GPUFLEET_REGION", stack.region),
                            ("GPUFLEET_RUN_TIMEOUT_SECONDS", str(config.run_timeout_seconds))):
            fn.add_environment(name, value)

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
            if key == "prepare_run":  # the cap on a cloud attempt's Batch attemptDurationSeconds
                fn.add_environment("GPUFLEET_RUN_TIMEOUT_SECONDS", str(config.run_timeout_seconds))
            if key in ("prepare_run", "collect_outputs"):  # the per-job output cap: the envelope and the check
                fn.add_environment("GPUFLEET_OUTPUT_MAX_BYTES", str(config.output_max_bytes))
                fn.add_environment("GPUFLEET_OUTPUT_MAX_FILES", str(config.output_max_files))
            if config.webhook_allow_private and key in ("api", "webhook"):  # local development only
                fn.add_environment("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")
            if key == "admin_api":  # a model registration reads the published manifest (gpufleet.models.catalog)
                fn.add_environment("GPUFLEET_MODEL_S3_ROOT", data.models_root)
            if self.state_machine is not None and key in ("api", "outbox"):
                fn.add_environment("GPUFLEET_STATE_MACHINE_ARN", self.state_machine.state_machine_arn)
        # Tables and buckets: per function, per table, per action, per key prefix (infra/grants.py).
        grant_data(
            {k: fn for k, fn in functions.items()},
            tables,
            {"outputs": data.outputs, "checkpoints": data.checkpoints, "logs": data.logs, "models": data.models},
        )
        # RunOnPrem's dispatch sends the node's queue its envelope (the task token stays on the attempt item).
        functions["dispatch_onprem"].add_to_role_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.node_queue_arn_pattern])
        )
        # ... and never to a node's signal queue (the pattern above matches them too; only the API's cancel nudges)
        functions["dispatch_onprem"].add_to_role_policy(
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=["sqs:SendMessage"],
                                resources=[self.signal_queue_arn_pattern])
        )
        self._grant_cloud_dispatch(config, compute, functions["dispatch_cloud"])
        # JobPending (AwaitPlacement) and CapacityFreed (CompleteRun, ClassifyFailure: an attempt released) wake the
        # scheduler (MarkTerminal's rare release of a failed workflow leaves it to the timer).
        for key in ("await_placement", "complete_run", "classify_failure"):
            self.bus.grant_put_events_to(functions[key])
        # NodeReady (the node API: a node's heartbeat made it usable) wakes it too; the node API may put that
        # event alone (it answers nodes: it never announces jobs or freed capacity)
        functions["node_api"].add_to_role_policy(iam.PolicyStatement(
            actions=["events:PutEvents"], resources=[self.bus.event_bus_arn],
            conditions={"StringEquals": {"events:source": EVENT_SOURCE, "events:detail-type": "NodeReady"}}))
        for key in ("notify", "webhook_events"):
            self.webhook_queue.grant_send_messages(functions[key])
        if self.state_machine is not None:
            self.state_machine.grant_start_execution(functions["outbox"])
            # SendTaskSuccess (placements; SendTaskFailure: a deadline passed) and SendTaskFailure
            # (cancellation) on this machine's tokens only
            functions["scheduler"].add_to_role_policy(
                iam.PolicyStatement(actions=["states:SendTaskSuccess", "states:SendTaskFailure"],
                                    resources=[self.state_machine.state_machine_arn])
            )
            functions["api"].add_to_role_policy(
                iam.PolicyStatement(actions=["states:SendTaskFailure"],
                                    resources=[self.state_machine.state_machine_arn])
            )
            # the node API answers RunOnPrem's tokens for the node it checked (never a node itself)
            functions["node_api"].add_to_role_policy(
                iam.PolicyStatement(actions=["states:SendTaskHeartbeat", "states:SendTaskSuccess",
                                             "states:SendTaskFailure"],
                                    resources=[self.state_machine.state_machine_arn])
            )
        # Batch jobs: each job definition's role allows what its stages call (the control-plane survey records it).
        # Both: fenced writes on job and attempt items, each bound to what its stage writes (ConditionCheckItem: the
        # epoch check of a transaction); a run attempt also puts timeline events (PutItem: with the worker's fenced
        # SCHEDULED -> RUNNING move, "resumed"), finalize none.
        jobs_table = tables["jobs"]
        run_role = compute.run_job_role
        # the finalize stage runs as the CPU Batch job (large clips) or in FinalizeLambda (short ones, warm): both
        # roles get the same grants, the signing secret included (infra/compute.py)
        finalize_roles = (compute.finalize_job_role, functions["finalize"].role)
        compute.add_signing_reader(functions["finalize"].role)
        functions["finalize"].add_environment("GPUFLEET_SIGNING_SECRET_ID", compute.signing_secret.secret_arn)
        compute.add_watermark_reader(functions["finalize"].role)
        functions["finalize"].add_environment("GPUFLEET_WATERMARK_SECRET_ID", compute.watermark_secret.secret_arn)
        leading = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [JOB]}}
        # a run attempt writes its worker attributes only (RUN_JOB_ATTRIBUTES) and puts timeline events only: a
        # compromised generate or container runtime cannot mark its job SUCCEEDED with an output, bill it or re-own it
        run_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["dynamodb:GetItem"], resources=[jobs_table.table_arn], conditions=leading))
        run_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"],
                                resources=[jobs_table.table_arn],
                                conditions={**leading, "ForAllValues:StringLike": {
                                    "dynamodb:Attributes": list(RUN_JOB_ATTRIBUTES)}}))
        run_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["dynamodb:PutItem"], resources=[jobs_table.table_arn],
                                conditions={**leading, "ForAllValues:StringEquals": {
                                    "dynamodb:Attributes": list(EVENT_ATTRIBUTES)}}))
        run_role.add_to_principal_policy(immutable_job_denial(jobs_table))
        # finalize reads the job and writes only its verdict, output, heartbeats and crash record (FINALIZE_ATTRIBUTES)
        for role in finalize_roles:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["dynamodb:GetItem"], resources=[jobs_table.table_arn], conditions=leading)
            )
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"],
                                    resources=[jobs_table.table_arn],
                                    conditions={**leading, "ForAllValues:StringEquals": {
                                        "dynamodb:Attributes": list(FINALIZE_ATTRIBUTES)}})
            )
        # Run attempts (generate, container): stage inputs, write and restore checkpoints, write generated output
        # and logs; a resume lists the job's fallback checkpoints.
        run_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:GetObjectVersion", "s3:PutObject"],
                resources=[b.arn_for_objects("jobs/*") for b in (data.outputs, data.checkpoints, data.logs)],
            )
        )
        run_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[data.checkpoints.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["jobs/*"]}},
            )
        )
        # generate loads published models (GPUFLEET_MODEL_S3_ROOT, infra/compute.py): read only, the manifest and
        # its files (gpufleet.models.loader lists nothing); operators publish with their own credentials
        run_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[data.models.arn_for_objects(MODELS_PREFIX + "*")])
        )
        # Finalize: reads the generated output, writes the video, manifest and result, and its log pages (no
        # checkpoints); moves a BLOCKED job's raw generated output out of jobs/ (copy, then delete that version for
        # good). The signing secret: infra/compute.py.
        for finalize_role in finalize_roles:
            finalize_role.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject"], resources=[data.outputs.arn_for_objects("jobs/*")])
            )
            finalize_role.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:PutObject"], resources=[data.logs.arn_for_objects("jobs/*")])
            )
            finalize_role.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:PutObject"], resources=[data.outputs.arn_for_objects("quarantine/jobs/*")])
            )
            finalize_role.add_to_principal_policy(
                iam.PolicyStatement(actions=["s3:DeleteObject", "s3:DeleteObjectVersion"],
                                    resources=[data.outputs.arn_for_objects("jobs/*/generated/*")])
            )
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
            iam.PolicyStatement(actions=["batch:ListJobs"], resources=["*"])
        )
        # Cancel nudges a cancelled on-prem job's node on its signal queue (gpufleet.store.queues.SqsNodeSignals):
        # signal queues only (<prefix>*_signals; a node id holds no "_"), never a node's work queue.
        functions["api"].add_to_role_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.signal_queue_arn_pattern])
        )
        functions["api"].add_environment("GPUFLEET_FINALIZE_QUEUE", compute.cpu_queue.job_queue_name)
        # Tenants' webhook signing secrets are sealed with this key (gpufleet.store.webhook_keys), never stored in
        # plaintext: the API (tenants fetch and rotate them) and the sender (signs) encrypt and decrypt with it.
        self.webhook_key = kms.Key(
            self, "WebhookSecretsKey", enable_key_rotation=True,
            description="Seals gpufleet tenants' webhook signing secrets (encryption context: the tenant)",
            removal_policy=RemovalPolicy.RETAIN if config.removal == "retain" else RemovalPolicy.DESTROY,
        )
        for key in ("api", "webhook"):
            functions[key].add_to_role_policy(
                iam.PolicyStatement(actions=["kms:Encrypt", "kms:Decrypt"], resources=[self.webhook_key.key_arn],
                                    conditions={"StringEquals": {
                                        "kms:EncryptionContext:gpufleet:purpose": "webhook-signing"}})
            )
            functions[key].add_environment("GPUFLEET_WEBHOOK_KEY_ID", self.webhook_key.key_arn)
        # HMAC key of the API's list cursors (gpufleet.api.settings: cursor_secret_arn).
        self.cursor_secret = secretsmanager.Secret(
            self,
            "CursorSecret",
            description="HMAC key of gpufleet API list cursors (rotating it invalidates open cursors)",
            generate_secret_string=secretsmanager.SecretStringGenerator(password_length=48, exclude_punctuation=True),
        )
        self.cursor_secret.grant_read(functions["api"])
        functions["api"].add_environment("GPUFLEET_CURSOR_SECRET_ARN", self.cursor_secret.secret_arn)
        # the provenance lookup detects with the keys both finalize paths embed with (infra/compute.py)
        compute.add_watermark_reader(functions["provenance_lookup"].role)  # the API itself never reads the keys
        functions["provenance_lookup"].add_environment("GPUFLEET_WATERMARK_SECRET_ARN",
                                                       compute.watermark_secret.secret_arn)
