"""Every name, limit and timeout of the CDK app, in one place.

Contract:
- :class:`InfraConfig` is a pydantic model validated at synth time. Each field
  can be overridden from CDK context as ``-c gpufleet:<field>=<value>`` (values
  from the command line arrive as strings; pydantic coerces them).
- Tests and the local harness pass small timeouts (seconds) through the same
  context keys, so the synthesized template they run is the real one.
- :data:`ALL_FUNCTIONS` names every Lambda of the app and its handler. Zip functions share one
  asset folder (``build/lambda``); a function with ``image`` set is a container-image function
  built from that Dockerfile (infra/lambda_image.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet import finalize_route as _route
from gpufleet.metrics import catalog as _metrics
from gpufleet.store import queues as _queues

CONTEXT_PREFIX = "gpufleet:"

#: Name of the stack the app synthesizes.
STACK_NAME = "Gpufleet"

#: Tag the lifecycle puts on a job's checkpoint objects once the job is terminal;
#: the checkpoints bucket expires tagged objects after ``checkpoint_expiry_days_after_end``.
CHECKPOINT_ENDED_TAG = ("gpufleet:job-ended", "true")

#: Per-node SQS queues are named ``<node_queue_prefix><node_id>`` (DLQ: ``<that>-dlq``, signal queue:
#: ``<that>_signals``, gpufleet.store.queues).
NODE_QUEUE_PREFIX = "gpufleet-node-"
DLQ_SUFFIX = "-dlq"
SIGNALS_SUFFIX = _queues.SIGNALS_SUFFIX

#: The session tag that carries the node id of an on-prem agent (IAM Roles Anywhere maps
#: the certificate subject's CN to ``x509Subject/CN``).
NODE_PRINCIPAL_TAG = "x509Subject/CN"

#: Namespace of the custom metrics the control plane emits (EMF; the catalogue is gpufleet.metrics.catalog,
#: whose definitions the dashboard and alarms are built from).
METRICS_NAMESPACE = _metrics.NAMESPACE

#: EventBridge detail types that trigger a scheduler pass (source ``gpufleet``).
EVENT_SOURCE = "gpufleet"
SCHEDULER_TRIGGER_EVENTS = ("JobPending", "CapacityFreed", "NodeReady")


@dataclass(frozen=True)
class FunctionDef:
    """One Lambda of the app: its role in the system and its handler (module.function).

    ``image``: the Dockerfile (repository-relative) of a container-image function, whose command is
    ``[handler]``; empty for a zip function of the shared asset.
    """

    key: str
    handler: str
    description: str
    timeout_s: int = 30
    memory_mb: int = 512
    image: str = ""


#: CheckPrompt loads torch + transformers + the MiniLM weights: a container image (zip limit is 250 MB).
CHECK_PROMPT_DOCKERFILE = "infra/images/check_prompt/Dockerfile"
#: FinalizeLambda runs the finalize stage (torch, onnxruntime, PyAV, c2pa and the moderation weights): an image too.
FINALIZE_DOCKERFILE = "infra/images/finalize/Dockerfile"


#: Step Functions task Lambdas (keys are the names ``infra/workflow.py`` receives).
TASK_FUNCTIONS: tuple[FunctionDef, ...] = (
    FunctionDef(
        "check_prompt", "lambdas.tasks.check_prompt.handler", "Tier-1 prompt safety check", 60, 3008,
        image=CHECK_PROMPT_DOCKERFILE,
    ),
    FunctionDef("await_placement", "lambdas.tasks.await_placement.handler", "Park the job on its placement token"),
    FunctionDef("prepare_run", "lambdas.tasks.prepare_run.handler", "Build the attempt's envelope and target"),
    FunctionDef("dispatch_onprem", "lambdas.tasks.dispatch_onprem.handler",
                "Keep an on-prem run's task token server-side and send the node its envelope"),
    FunctionDef("dispatch_cloud", "lambdas.tasks.dispatch_cloud.handler",
                "Submit a cloud container job (its image beside the supervisor), its tokens kept server-side"),
    FunctionDef("complete_run", "lambdas.tasks.complete_run.handler", "Record a finished run"),
    FunctionDef("mark_terminal", "lambdas.tasks.mark_terminal.handler", "Record a terminal status"),
    FunctionDef("classify_failure", "lambdas.tasks.classify_failure.handler", "Classify a failed attempt"),
    FunctionDef("collect_outputs", "lambdas.tasks.collect_outputs.handler", "Count a container job's output files"),
    FunctionDef("publish", "lambdas.tasks.publish.handler", "Fenced publish of the outputs"),
    FunctionDef("bill", "lambdas.tasks.bill.handler", "Write the ledger entry of a charged attempt"),
    # the finalize stage of short clips, warm (gpufleet.finalize_route: its memory, timeout and clip bound)
    FunctionDef(
        "finalize", "lambdas.tasks.finalize.handler", "Finalize a short clip: moderation, watermark, H.264, C2PA",
        _route.LAMBDA_TIMEOUT_S, _route.LAMBDA_MEMORY_MB, image=FINALIZE_DOCKERFILE,
    ),
    FunctionDef("notify", "lambdas.tasks.notify.handler", "Queue the job's webhook event"),
)

API_FUNCTION = FunctionDef("api", "lambdas.api.handler.handler", "The HTTPS API", 29, 1024)
#: POST /v1/provenance/lookup, apart from the API: the watermark detector is seconds of CPU on a large frame (a whole
#: vCPU from 1,769 MB), and its role is the only API-side reader of the watermark keys
LOOKUP_FUNCTION = FunctionDef(
    "provenance_lookup", "lambdas.api.lookup.handler", "Provenance lookups: the watermark detector, apart from the API",
    29, 2048,
)
#: 2,048 MB: Lambda gives a function a whole vCPU from 1,769 MB, and a pass's cycle is CPU-bound (the simulated
#: 100,000 x 10,000 pass, docs/benchmarks.md, assumes a shard has a core)
SCHEDULER_FUNCTION = FunctionDef("scheduler", "lambdas.tasks.scheduler_pass.handler", "One scheduler pass", 300, 2048)
OUTBOX_FUNCTION = FunctionDef("outbox", "lambdas.tasks.outbox.handler", "Start workflows from the jobs stream", 60)
WEBHOOK_FUNCTION = FunctionDef("webhook", "lambdas.tasks.webhook_sender.handler", "Deliver signed webhooks", 60)
WEBHOOK_EVENTS_FUNCTION = FunctionDef(
    "webhook_events", "lambdas.tasks.webhook_events.handler", "Queue started/progress webhooks from the jobs stream", 60
)
REGISTER_NODE_FUNCTION = FunctionDef(
    "register_node", "lambdas.nodes.register.handler", "Create a node's SQS queue and DLQ", 30
)
NODE_API_FUNCTION = FunctionDef(
    "node_api", "lambdas.nodes.api.handler", "The node API: on-prem agents act on their own attempts only", 29
)
ADMIN_API_FUNCTION = FunctionDef(
    "admin_api", "lambdas.admin.handler.handler", "The administration API: operators only, every change audited", 29
)

ALL_FUNCTIONS: tuple[FunctionDef, ...] = (
    *TASK_FUNCTIONS,
    API_FUNCTION,
    LOOKUP_FUNCTION,
    SCHEDULER_FUNCTION,
    OUTBOX_FUNCTION,
    WEBHOOK_FUNCTION,
    WEBHOOK_EVENTS_FUNCTION,
    REGISTER_NODE_FUNCTION,
    NODE_API_FUNCTION,
    ADMIN_API_FUNCTION,
)


class InfraConfig(BaseModel):
    """Synth-time settings. Defaults are production values; tests override timeouts via context."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = Field(default="gpufleet", pattern=r"^[a-z][a-z0-9-]{1,20}$")
    #: Bucket names become ``<bucket_prefix>-outputs|checkpoints|logs`` when set (S3 names are global:
    #: leave empty in AWS to let CloudFormation generate them; the local stack sets ``gpufleet``).
    bucket_prefix: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9-]{1,40})?$")
    removal: Literal["retain", "destroy"] = "retain"

    # Workflow timing (seconds). Tests use single-digit values.
    heartbeat_seconds: int = Field(default=120, ge=1)
    #: RunCloudContainer's HeartbeatSeconds: Batch must find capacity, start the task and pull the images before the
    #: supervisor's first beat (never below ``heartbeat_seconds``)
    cloud_heartbeat_seconds: int = Field(default=900, ge=1)
    placement_timeout_seconds: int = Field(default=7 * 24 * 3600, ge=1)
    run_timeout_seconds: int = Field(default=24 * 3600, ge=1)
    finalize_timeout_seconds: int = Field(default=3600, ge=1)
    finalize_retry_interval_seconds: int = Field(default=5, ge=1)
    finalize_max_attempts: int = Field(default=3, ge=1)
    #: each retry waits this many times the one before (Step Functions' BackoffRate)
    finalize_retry_backoff_rate: float = Field(default=2.0, ge=1.0, le=10.0)
    #: FinalizeRoute: a clip of at most this many frames × delivered pixels finalizes in the warm FinalizeLambda,
    #: a larger one in the CPU Batch job (gpufleet.finalize_route; 0 sends every clip to Batch)
    finalize_lambda_max_pixels: int = Field(default=_route.LAMBDA_MAX_PIXELS, ge=0)

    # Lifecycle policies as data (JSON; empty = the defaults of gpufleet.lifecycle). Set on every function
    # as GPUFLEET_RETRY_POLICY / GPUFLEET_BILLING_POLICY.
    retry_policy: str = ""
    billing_policy: str = ""
    # Retry knobs as single context keys; they override the matching fields of ``retry_policy``
    # (base_s, failure_budget, quarantine_after_workers of gpufleet.lifecycle.retry.RetryPolicy).
    retry_base_seconds: float | None = Field(default=None, gt=0)
    max_failures: int | None = Field(default=None, ge=0)
    quarantine_after_workers: int | None = Field(default=None, ge=1)

    # Container jobs: the per-job cap on the files left under the output directory (over it: a USER failure).
    output_max_bytes: int = Field(default=10 * 1024**3, ge=0)
    output_max_files: int = Field(default=1000, ge=1, le=10000)

    # Scheduler.
    scheduler_rate_minutes: int = Field(default=1, ge=1)
    #: passes run side by side, each over its shard (gpufleet.scheduler.shards): one timer rule and one events rule
    #: per shard, the shard in the rule's input; the function's reserved concurrency is the shard count
    scheduler_shards: int = Field(default=1, ge=1, le=16)

    # Storage lifecycle.
    checkpoint_expiry_days_after_end: int = Field(default=1, ge=1)
    checkpoint_max_age_days: int = Field(default=30, ge=1)
    log_retention_days: int = Field(default=90, ge=1)
    outputs_ia_after_days: int = Field(default=30, ge=1)
    #: how long a BLOCKED job's raw generated output stays under ``quarantine/`` (outputs bucket) for review
    quarantine_retention_days: int = Field(default=30, ge=1)
    access_log_retention_days: int = Field(default=365, ge=1)
    #: Host the web console (infra/console.py: private S3 + CloudFront, a Cognito user pool and identity pool).
    #: Off by default and in the local stack, which serves the console itself (gpufleet dev).
    console_hosting: bool = False
    #: The Cognito hosted UI's domain prefix (``https://<prefix>.auth.<region>.amazoncognito.com``), unique in
    #: the region; empty: ``<prefix>-console-<account id>``.
    console_domain_prefix: str = Field(default="", pattern=r"^$|^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

    # API stage throttling.
    api_rate_limit: float = Field(default=100.0, gt=0)
    api_burst_limit: int = Field(default=200, gt=0)

    # Webhooks: SQS redelivery drives the exponential backoff; the DLQ receives after this many tries.
    webhook_max_receives: int = Field(default=15, ge=1)
    webhook_retention_hours: int = Field(default=48, ge=1)
    #: Local development only: the API and the webhook sender accept http and private/loopback webhook
    #: targets (env GPUFLEET_WEBHOOK_ALLOW_PRIVATE; see gpufleet.webhooks.urlpolicy). Production: false.
    webhook_allow_private: bool = False

    # Node queues (created at runtime by the registration function).
    node_queue_max_receives: int = Field(default=5, ge=1)
    #: The CA that issues node certificates (IAM Roles Anywhere trust anchor): a PEM bundle, or the ARN
    #: of an ACM Private CA. Neither: the agent role cannot be assumed (docs/operations.md).
    node_ca_pem: str = ""
    node_ca_arn: str = Field(default="", pattern=r"^(arn:aws[a-z-]*:acm-pca:[a-z0-9-]+:\d{12}:certificate-authority/.+)?$")

    # Compute.
    gpu_instance_types: tuple[str, ...] = ("g5.xlarge", "g5.2xlarge", "g6.xlarge", "g6.2xlarge")
    cpu_instance_types: tuple[str, ...] = ("c6i.xlarge", "c6i.2xlarge")
    spot_max_vcpus: int = Field(default=256, ge=1)
    ondemand_max_vcpus: int = Field(default=64, ge=1)
    #: the provenance lookup function's reserved concurrency: at most this many lookups at once, and that much of the
    #: account's concurrency kept for them (0: none reserved, for accounts whose whole limit is small)
    lookup_reserved_concurrency: int = Field(default=0, ge=0)
    #: vCPUs the GPU on-demand environment keeps running when idle (Batch's minvCpus): warm instances, whose host
    #: cache keeps the models their jobs loaded, at their hourly price; 0 scales to nothing when the queue is empty
    ondemand_min_vcpus: int = Field(default=0, ge=0)
    #: the gang compute environment (multi-node parallel jobs of cloud gangs: on-demand, one cluster placement group)
    gang_max_vcpus: int = Field(default=64, ge=1)
    #: seconds between RunCloudGang's looks at its multi-node parallel job (tests use 1)
    gang_poll_seconds: int = Field(default=30, ge=1)
    cpu_max_vcpus: int = Field(default=64, ge=1)
    nat_gateways: int = Field(default=1, ge=0)
    gpu_job_vcpus: int = Field(default=4, ge=1)
    #: the GPU instances' host cache of published models and staged inputs, shared by the instance's GPU jobs (its
    #: instance store when it has one: g5, g6), bounded by the runtime (GPUFLEET_CACHE_MAX_BYTES); 0: none (each job
    #: fetches its model into its own container)
    gpu_host_cache_gib: int = Field(default=150, ge=0)
    gpu_job_memory_mib: int = Field(default=15000, ge=512)
    cpu_job_vcpus: int = Field(default=2, ge=1)
    cpu_job_memory_mib: int = Field(default=4096, ge=512)
    #: A registry image for the GPU container; empty means build ``gpu_container/Dockerfile`` as an asset.
    gpu_image: str = ""

    # Alarms.
    api_5xx_threshold: int = Field(default=5, ge=1)
    pending_wait_alarm_seconds: int = Field(default=1800, ge=1)
    # SLOs (multi-window burn-rate alarms, docs/operations.md "Alarms and SLOs").
    #: queue wait: this share of placements per pool wait at most ``slo_queue_wait_seconds`` PENDING
    slo_queue_wait_seconds: int = Field(default=1800, ge=1)
    slo_queue_wait_objective: float = Field(default=0.95, gt=0, lt=1)
    #: job success rate, user errors, cancellations, rejections and moderation blocks excluded
    slo_success_objective: float = Field(default=0.99, gt=0, lt=1)
    #: API availability: share of requests not answered 5XX
    slo_api_availability_objective: float = Field(default=0.999, gt=0, lt=1)
    alarm_email: str = ""

    def retry_policy_json(self) -> str:
        """The effective lifecycle retry policy as the JSON ``GPUFLEET_RETRY_POLICY`` carries.

        ``retry_policy`` (JSON) overlaid with ``retry_base_seconds`` / ``max_failures`` /
        ``quarantine_after_workers`` when set, validated by ``RetryPolicy`` at synth time (an
        invalid combination fails the synth, not the deployed Lambda).
        """
        from gpufleet.lifecycle.retry import RetryPolicy

        values: dict[str, Any] = json.loads(self.retry_policy) if self.retry_policy else {}
        overrides = {
            "base_s": self.retry_base_seconds,
            "failure_budget": self.max_failures,
            "quarantine_after_workers": self.quarantine_after_workers,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return json.dumps(RetryPolicy.model_validate(values).model_dump(), sort_keys=True)

    def name(self, suffix: str) -> str:
        """A physical name under the app prefix (for resources that need a stable name)."""
        return f"{self.prefix}-{suffix}"

    @model_validator(mode="after")
    def _warm_within_ceiling(self) -> InfraConfig:
        if self.ondemand_min_vcpus > self.ondemand_max_vcpus:
            raise ValueError(f"ondemand_min_vcpus ({self.ondemand_min_vcpus}) exceeds ondemand_max_vcpus "
                             f"({self.ondemand_max_vcpus})")
        return self

    @property
    def node_queue_prefix(self) -> str:
        return NODE_QUEUE_PREFIX.replace("gpufleet-", f"{self.prefix}-", 1)

    @classmethod
    def from_context(cls, get: Any) -> InfraConfig:
        """Build from a CDK ``node.try_get_context``-like callable; unknown keys are ignored there."""
        values: dict[str, Any] = {}
        for field, info in cls.model_fields.items():
            raw = get(CONTEXT_PREFIX + field)
            if raw is None:
                continue
            if info.annotation == tuple[str, ...] and isinstance(raw, str):
                raw = tuple(x.strip() for x in raw.split(",") if x.strip())
            values[field] = raw
        return cls(**values)
