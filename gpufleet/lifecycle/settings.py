"""Settings and clients of the lifecycle task Lambdas.

Contract: :class:`LifecycleSettings` (a :class:`gpufleet.settings.StorageSettings`) is loaded once
per container at start-up from the environment the CDK orchestration stack sets (``GPUFLEET_<FIELD>``); :class:`Deps` bundles the stores (job item, ledger,
safety profiles, checkpoints, event bus), the clock, the random source and the pluggable
collaborators (prompt filter, quota release). The task handlers build ``Deps`` once per container
(``lambdas/tasks/_deps.py``, with :meth:`Deps.build` over boto3 clients); tests build it explicitly.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from gpufleet.clock import Clock
from gpufleet.lifecycle.billing import BillingPolicy, default_rules
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.metrics import Metrics
from gpufleet.settings import StorageSettings
from gpufleet.store.jobs import DynamoJobStore, JobStore
from gpufleet.store.ledger import DynamoLedgerStore, LedgerStore
from gpufleet.store.objects import Checkpoints, JobOutputs, S3Checkpoints, S3JobOutputs
from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceIndex
from gpufleet.store.safety_profiles import DynamoSafetyProfiles, SafetyProfileStore
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints, WebhookEndpointStore
from gpufleet.store.workflow import EventBridgeBus, EventBus

#: (prompt) -> {"allowed": bool, "reason": str | None, ...}
PromptCheck = Callable[[str], dict[str, Any]]
#: (job_id, epoch) -> whether this call released the attempt's quota usage and allocations (False: already released)
Release = Callable[[str, int], bool]


class LifecycleSettings(StorageSettings):
    """``GPUFLEET_*`` of the task Lambdas; the policies are JSON (``GPUFLEET_RETRY_POLICY``,
    ``GPUFLEET_BILLING_POLICY``, set by the CDK from context). Billing rules given there override
    the default rules one outcome at a time."""

    model_config = SettingsConfigDict(validate_by_name=True)
    config_label: ClassVar[str] = "lifecycle settings"

    webhook_queue_url: str = ""
    event_bus: str = ""
    heartbeat_seconds: int = Field(120, ge=1)
    #: the deployment's run timeout (RunCloud's state and the GPU job definition): the most a cloud attempt's
    #: Batch ``attemptDurationSeconds`` may be (PrepareRun, :func:`gpufleet.batchdef.attempt_duration_seconds`)
    run_timeout_seconds: int = Field(24 * 3600, ge=1)
    #: the prompt filter's policy file (JSON); empty: the packaged policy (gpufleet/safety/default_policy.json)
    prompt_policy: str = ""
    #: per-job cap on what a container job may leave under its output directory (env
    #: GPUFLEET_OUTPUT_MAX_BYTES / GPUFLEET_OUTPUT_MAX_FILES); over it the job fails as a USER error
    output_max_bytes: int = Field(10 * 1024**3, ge=0)
    output_max_files: int = Field(1000, ge=1, le=10000)
    retry: RetryPolicy = Field(default_factory=RetryPolicy, validation_alias="GPUFLEET_RETRY_POLICY")
    billing: BillingPolicy = Field(default_factory=BillingPolicy, validation_alias="GPUFLEET_BILLING_POLICY")

    @field_validator("billing", mode="before")
    @classmethod
    def _billing_rules_over_defaults(cls, v: Any) -> Any:
        if isinstance(v, dict) and "rules" in v:
            return {**v, "rules": {**default_rules(), **v["rules"]}}
        return v


def prompt_check_for(policy_path: str = "") -> PromptCheck:
    """The prompt check of the process-wide :class:`gpufleet.safety.PromptFilter` with that policy: ``{"allowed",
    "reason", "category", "score", "policy_version"}`` (category: the blocking one, or the top-scoring one).
    Checks made at once in one process share a batch (:mod:`gpufleet.prompt_batch`)."""

    def check(prompt: str) -> dict[str, Any]:
        verdict = _prompt_batcher(policy_path).check(prompt)
        score = verdict.score
        return {"allowed": bool(verdict.allowed), "reason": verdict.reason, "category": verdict.category,
                "score": None if score is None else round(float(score), 4), "policy_version": verdict.policy_version}

    return check


_default_prompt_check = prompt_check_for()

#: the benign prompt a warm-up decides (never a job's)
WARM_UP_PROMPT = "a lighthouse on a cliff at dusk"


def warm_prompt_check(policy_path: str = "") -> None:
    """Load the process-wide prompt filter with that policy now (encoder, policy, speller) by deciding one benign
    prompt, so the first job's check does not pay for it (a function's init phase)."""
    _prompt_batcher(policy_path).decide([WARM_UP_PROMPT])
_BATCHERS: dict[str, Any] = {}
_BATCHERS_LOCK = threading.Lock()


def _prompt_batcher(policy_path: str) -> Any:
    """The process-wide batcher of the prompt filter with that policy (one per policy, as the filter)."""
    with _BATCHERS_LOCK:
        found = _BATCHERS.get(policy_path)
        if found is None:
            from gpufleet.prompt_batch import PromptBatcher

            def decide(prompts: list[str]) -> list[Any]:
                from gpufleet.safety import PromptFilter  # heavy (transformers); loaded on first use

                return PromptFilter.default(policy_path or None).check_many(prompts)

            found = _BATCHERS[policy_path] = PromptBatcher(decide)
        return found


@dataclass
class Deps:
    """The stores and collaborators of the lifecycle tasks (see :meth:`build` to wire them from clients)."""

    jobs: JobStore
    ledger: LedgerStore
    safety: SafetyProfileStore
    settings: LifecycleSettings
    clock: Clock
    #: checkpoint retention (terminal jobs' checkpoints expire); None: not tagged
    checkpoints: Checkpoints | None = None
    #: the files container jobs published (CollectOutputs); None: not listed
    outputs: JobOutputs | None = None
    #: the bus that hears ``JobPending`` (a scheduler pass now); None: the timer's pass picks the job up
    events: EventBus | None = None
    #: SQS client of the webhook queue (:func:`gpufleet.webhooks.delivery.enqueue`)
    sqs: Any = None
    rand: Callable[[], float] = field(default_factory=lambda: random.SystemRandom().random)
    prompt_check: PromptCheck = _default_prompt_check
    #: gives an attempt's capacity back; None: nothing to release
    release: Release | None = None
    #: the lifecycle's metrics (EMF on stdout; :mod:`gpufleet.metrics.catalog`)
    metrics: Metrics = field(default_factory=Metrics)
    #: the provenance index Publish writes (:mod:`gpufleet.store.provenance`); None: not indexed
    provenance: ProvenanceIndex | None = None
    #: tenants' webhook endpoints Notify fans events out to (:mod:`gpufleet.store.webhook_endpoints`); None: none
    webhook_endpoints: WebhookEndpointStore | None = None

    @classmethod
    def build(
        cls, ddb, *, settings: LifecycleSettings, clock: Clock, s3=None, sqs=None, events=None,
        **collaborators: Any,
    ) -> Deps:
        """The Dynamo/S3/EventBridge stores over explicit clients, plus ``collaborators`` (rand, prompt_check,
        release)."""
        tables = settings.tables
        collaborators.setdefault("prompt_check", prompt_check_for(settings.prompt_policy))
        return cls(
            jobs=DynamoJobStore(ddb, tables, clock),
            provenance=DynamoProvenanceIndex(ddb, tables.jobs),
            webhook_endpoints=DynamoWebhookEndpoints(ddb, tables.control),
            ledger=DynamoLedgerStore(ddb, tables),
            safety=DynamoSafetyProfiles(ddb, tables.control, clock),
            settings=settings,
            clock=clock,
            checkpoints=S3Checkpoints(s3, settings.checkpoints_bucket) if s3 is not None else None,
            outputs=S3JobOutputs(s3, settings.outputs_bucket) if s3 is not None else None,
            events=EventBridgeBus(events, settings.event_bus) if events is not None and settings.event_bus else None,
            sqs=sqs,
            **collaborators,
        )
