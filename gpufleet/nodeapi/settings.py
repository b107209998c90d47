"""Settings and wiring of the node API (validated once at start-up).

:class:`NodeApiSettings` is a :class:`gpufleet.settings.Settings` (``GPUFLEET_*`` environment variables,
loaded once by the entry point: the Lambda handler, the dev stack). :func:`build_api` wires :class:`~gpufleet.nodeapi.app.NodeApi` over the clients the
entry point (a Lambda handler, the dev stack, a test) builds.
"""

from __future__ import annotations

from pydantic import Field

from gpufleet.clock import Clock
from gpufleet.nodeapi.app import NodeApi
from gpufleet.nodeapi.cloud_dispatch import CloudDispatchSettings
from gpufleet.nodeapi.service import Buckets, NodeService, NodeServiceDeps
from gpufleet.settings import InputOwnershipSettings, StorageSettings
from gpufleet.store.credentials import StsCredentialVendor
from gpufleet.store.jobitem import JobItem
from gpufleet.store.nodes import DynamoNodeStore
from gpufleet.store.runs import DynamoRunStore
from gpufleet.store.workflow import EventBridgeBus, SfnTaskTokens


class NodeApiSettings(InputOwnershipSettings):
    config_label = "node API settings"

    agent_role_names: str = Field("gpufleet-agent", min_length=1,
                                  description="comma-separated names of the roles whose sessions are nodes")
    node_job_role_arn: str = Field("", description="role assumed for per-attempt object credentials")
    credentials_duration_s: int = Field(3600, ge=900, le=43200)
    supervisor_role_arn: str = Field("", description="the cloud supervisor role, assumed for a cloud attempt's "
                                     "supervisor session (gpufleet.nodeapi.supervisor); empty: no exchange")
    node_api_arn: str = Field("", description="arn:<p>:execute-api:<region>:<account>:<api id>, scoping a "
                              "supervisor session's execute-api:Invoke to its attempt's routes")
    max_node_ttl_s: int = Field(300, ge=1)
    partition: str = "aws"
    gang_barrier_timeout_s: float = Field(300.0, gt=0, description="a gang's start barrier: after this long "
                                          "since dispatch with a member not ready, the gang fails (retried as a unit)")
    event_bus: str = Field("", description="the app's EventBridge bus (NodeReady wakes the scheduler); empty: none")
    gang_silence_s: float = Field(90.0, gt=0, description="a started gang fails when a running member has not "
                                  "heartbeaten for this long")
    model_s3_root: str = Field("", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^*?]+/)+)?$",
                               description="s3://bucket/prefix/ of the published models: every attempt session may "
                               "read them (gpufleet.nodeapi.scope); empty: none")

    @property
    def agent_roles(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.agent_role_names.split(",") if r.strip())

    @property
    def supervisor_roles(self) -> tuple[str, ...]:
        """The cloud supervisor role's name (the last part of its ARN), or none."""
        return (self.supervisor_role_arn.rsplit("/", 1)[-1],) if self.supervisor_role_arn else ()


def build_api(settings: NodeApiSettings, *, dynamodb, stepfunctions, sts, clock: Clock, events=None) -> NodeApi:
    """The node API over these clients (``events``: an EventBridge client; with ``event_bus`` set, a node that
    becomes usable wakes the scheduler)."""
    vendor = (StsCredentialVendor(sts, settings.node_job_role_arn, settings.credentials_duration_s)
              if settings.node_job_role_arn and sts is not None else None)
    deps = NodeServiceDeps(
        runs=DynamoRunStore(dynamodb, settings.jobs_table, clock),
        nodes=DynamoNodeStore(dynamodb, settings.control_table),
        tokens=SfnTaskTokens(stepfunctions),
        worker_item=lambda job_id, epoch: JobItem(settings.jobs_table, job_id, epoch, client=dynamodb, clock=clock,
                                                  return_values="UPDATED_NEW"),
        clock=clock,
        buckets=Buckets(settings.checkpoints_bucket, settings.outputs_bucket, settings.logs_bucket),
        credentials=vendor,
        max_node_ttl_s=settings.max_node_ttl_s,
        partition=settings.partition,
        gang_barrier_timeout_s=settings.gang_barrier_timeout_s,
        gang_silence_s=settings.gang_silence_s,
        supervisor_credentials=(StsCredentialVendor(sts, settings.supervisor_role_arn, settings.credentials_duration_s)
                                if settings.supervisor_role_arn and sts is not None else None),
        node_api_arn=settings.node_api_arn,
        ownership=settings.input_ownership(),
        events=EventBridgeBus(events, settings.event_bus) if events is not None and settings.event_bus else None,
        model_s3_root=settings.model_s3_root,
    )
    return NodeApi(NodeService(deps), settings.agent_roles, settings.supervisor_roles)


class CloudDispatchEnv(StorageSettings):
    """The ``dispatch_cloud`` Lambda's settings (RunCloudContainer; :mod:`gpufleet.nodeapi.cloud_dispatch`): what the
    per-image definitions and the supervisor need from the deployment, set by the stack (infra/orchestration.py)."""

    config_label = "cloud dispatch settings"

    prefix: str = Field("gpufleet", pattern=r"^[a-z][a-z0-9-]{1,20}$",
                        description="the app prefix: definitions are named <prefix>-tenant-<digest>")
    supervisor_image: str = Field(..., min_length=1, description="the platform's runtime image (the supervisor)")
    tenant_execution_role_arn: str = Field(..., min_length=1, description="the task execution role of the tenant "
                                           "definitions: image pull and logs only (no task role)")
    tenant_log_group: str = Field(..., min_length=1, description="the log group of the task's containers")
    region: str = Field(..., min_length=1)
    node_api_url: str = Field(..., min_length=1, description="the node API's base URL, as the supervisor calls it")
    run_timeout_seconds: int = Field(24 * 3600, ge=1)

    def dispatch(self) -> CloudDispatchSettings:
        return CloudDispatchSettings(
            prefix=self.prefix, supervisor_image=self.supervisor_image,
            execution_role_arn=self.tenant_execution_role_arn, log_group=self.tenant_log_group, region=self.region,
            node_api_url=self.node_api_url, run_timeout_seconds=self.run_timeout_seconds,
        )
