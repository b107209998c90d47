"""The gpufleet stack: data, compute, functions, orchestration, API, on-prem, observability.

Contract: one stack (one ``create_stack``, also locally into moto) whose
outputs are the names the CLI, the agents and the local harness need
(:data:`OUTPUT_KEYS`).
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.admin import AdminAccess
from infra.api import STAGE_NAME, TENANT_PATHS, Api
from infra.compute import Compute
from infra.config import ALL_FUNCTIONS, InfraConfig
from infra.console import ConsoleHosting
from infra.data import Data
from infra.functions import Functions
from infra.observability import Observability
from infra.onprem import OnPrem
from infra.orchestration import Orchestration

#: Stack output keys (CloudFormation output names).
OUTPUT_KEYS = (
    "JobsTable",
    "ControlTable",
    "LedgerTable",
    "OutputsBucket",
    "CheckpointsBucket",
    "LogsBucket",
    "ModelsBucket",
    "ModelsRoot",
    "RestApiId",
    "ApiUrl",
    "StateMachineArn",
    "WebhookQueueUrl",
    "WebhookDlqUrl",
    "EventBusName",
    "GpuSpotQueue",
    "GpuOnDemandQueue",
    "CpuQueue",
    "GpuJobDefinition",
    "CpuJobDefinition",
    "AgentRoleArn",
    "NodeQueuePrefix",
    "AdminRoleArn",
    "AdminInvokePolicyArn",
    "TenantInvokePolicyArn",
    "SigningSecretArn",
    "WatermarkSecretArn",
)


_RETENTIONS = (
    (1, logs.RetentionDays.ONE_DAY),
    (7, logs.RetentionDays.ONE_WEEK),
    (14, logs.RetentionDays.TWO_WEEKS),
    (30, logs.RetentionDays.ONE_MONTH),
    (90, logs.RetentionDays.THREE_MONTHS),
    (180, logs.RetentionDays.SIX_MONTHS),
    (365, logs.RetentionDays.ONE_YEAR),
    (731, logs.RetentionDays.TWO_YEARS),
    (1827, logs.RetentionDays.FIVE_YEARS),
    (3653, logs.RetentionDays.TEN_YEARS),
)


def _retention(days: int) -> logs.RetentionDays:
    """The smallest CloudWatch Logs retention that keeps at least ``days``."""
    for limit, retention in _RETENTIONS:
        if limit >= days:
            return retention
    return _RETENTIONS[-1][1]


class GpufleetStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, config: InfraConfig, **kwargs) -> None:
        super().__init__(scope, cid, **kwargs)
        self.config = config
        retention = _retention(config.log_retention_days)
        self.data = Data(self, "Data", config=config)
        self.compute = Compute(self, "Compute", config=config, log_retention=retention,
                               models_root=self.data.models_root)
        self.functions = Functions(
            self,
            "Functions",
            config=config,
            definitions=ALL_FUNCTIONS,
            environment={**self.data.table_env(), **self.data.bucket_env()},
            log_retention=retention,
        )
        self.orchestration = Orchestration(
            self,
            "Orchestration",
            config=config,
            data=self.data,
            compute=self.compute,
            functions=self.functions,
            log_retention=retention,
        )
        # readers: the finalize job role and FinalizeLambda's role; the watermark secret's also the provenance lookup's
        self.compute.seal_signing_secret()
        self.api = Api(
            self,
            "Api",
            config=config,
            api_function=self.functions["api"],
            register_function=self.functions["register_node"],
            node_api_function=self.functions["node_api"],
            admin_api_function=self.functions["admin_api"],
            lookup_function=self.functions["provenance_lookup"],
            log_retention=retention,
        )
        # RunCloudContainer's supervisors call the node API at this URL (built from the REST API's id, not its stage:
        # the stage depends on the API function, which names the state machine, which names the dispatch function)
        self.functions["dispatch_cloud"].add_environment(
            "GPUFLEET_NODE_API_URL",
            f"https://{self.api.rest_api.rest_api_id}.execute-api.{self.region}.{self.url_suffix}/{STAGE_NAME}")
        self.admin = AdminAccess(self, "Admin", config=config, admin_api_arns=self.api.admin_api_arns,
                                 tenant_api_arns=self.api.tenant_api_arns)
        self.onprem = OnPrem(
            self,
            "OnPrem",
            config=config,
            data=self.data,
            bus=self.orchestration.bus,
            register_function=self.functions["register_node"],
            node_api_function=self.functions["node_api"],
            node_api_arn=self.api.node_api_arn,
            node_attempt_routes_arn=self.api.node_attempt_routes_arn,
            execute_api_arn=self.api.execute_api_arn,
        )
        #: the web console's hosting and sign-in (``gpufleet:console_hosting=true``), else None
        self.console: ConsoleHosting | None = None
        if config.console_hosting:
            self.console = ConsoleHosting(
                self, "Console", config=config, rest_api=self.api.rest_api, stage=STAGE_NAME, paths=TENANT_PATHS,
                access_logs=self.data.access_logs,
                media_origins=[f"https://{self.data.outputs.bucket_regional_domain_name}"])
            self.console.admit(self.api)
        self.observability = Observability(
            self,
            "Observability",
            config=config,
            api_name=config.name("api"),
            state_machine=self.orchestration.state_machine,
            webhook_queue=self.orchestration.webhook_queue,
            dead_letter_queues={
                "Webhook": self.orchestration.webhook_dlq,
                "Outbox": self.orchestration.outbox_dlq,
                "WebhookEvents": self.orchestration.webhook_events_dlq,
            },
            critical_functions={
                "Scheduler": self.functions["scheduler"],
                "Outbox": self.functions["outbox"],
                "Api": self.functions["api"],
                "ProvenanceLookup": self.functions["provenance_lookup"],
            },
        )
        self._outputs()

    def _outputs(self) -> None:
        d, c, o = self.data, self.compute, self.orchestration
        values = {
            "JobsTable": d.tables["jobs"].table_name,
            "ControlTable": d.tables["control"].table_name,
            "LedgerTable": d.tables["ledger"].table_name,
            "OutputsBucket": d.outputs.bucket_name,
            "CheckpointsBucket": d.checkpoints.bucket_name,
            "LogsBucket": d.logs.bucket_name,
            "ModelsBucket": d.models.bucket_name,
            # published models: the runtime's and the agents' GPUFLEET_MODEL_S3_ROOT (docs/operations.md)
            "ModelsRoot": d.models_root,
            "RestApiId": self.api.rest_api.rest_api_id,
            "ApiUrl": self.api.rest_api.url,
            "WebhookQueueUrl": o.webhook_queue.queue_url,
            "WebhookDlqUrl": o.webhook_dlq.queue_url,
            "EventBusName": o.bus.event_bus_name,
            "GpuSpotQueue": c.gpu_spot_queue.job_queue_name,
            "GpuOnDemandQueue": c.gpu_ondemand_queue.job_queue_name,
            "CpuQueue": c.cpu_queue.job_queue_name,
            "GpuJobDefinition": c.gpu_job_definition.job_definition_name,
            "CpuJobDefinition": c.cpu_job_definition.job_definition_name,
            "AgentRoleArn": self.onprem.agent_role.role_arn,
            "NodeQueuePrefix": self.config.node_queue_prefix,
            "AdminRoleArn": self.admin.admin_role.role_arn,
            "AdminInvokePolicyArn": self.admin.admin_policy.managed_policy_arn,
            "TenantInvokePolicyArn": self.admin.tenant_policy.managed_policy_arn,
            "SigningSecretArn": c.signing_secret.secret_arn,
            "WatermarkSecretArn": c.watermark_secret.secret_arn,
        }
        if o.state_machine is not None:
            values["StateMachineArn"] = o.state_machine.state_machine_arn
        if self.console is not None:  # only with console hosting: not among OUTPUT_KEYS
            values.update({
                "ConsoleUrl": f"https://{self.console.distribution.distribution_domain_name}/",
                "ConsoleBucket": self.console.bucket.bucket_name,
                "ConsoleUserPoolId": self.console.user_pool.user_pool_id,
                "ConsoleUserPoolClientId": self.console.client.user_pool_client_id,
                "ConsoleIdentityPoolId": self.console.identity_pool.ref,
            })
        for key, value in values.items():
            CfnOutput(self, key, value=value)
