"""Settings and clients of the lifecycle task Lambdas.

Contract: :class:`LifecycleSettings` is validated at start-up from the environment the CDK
orchestration stack sets (names below); :class:`Deps` bundles the stores (job item, ledger,
safety profiles, checkpoints, event bus), the clock, the random source and the pluggable
collaborators (prompt filter, quota release). The task handlers build ``Deps`` once per container
(``lambdas/tasks/_deps.py``, with :meth:`Deps.build` over boto3 clients); tests build it explicitly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.clock import Clock
from gpufleet.lifecycle.billing import BillingPolicy
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.store.jobs import DynamoJobStore, JobStore
from gpufleet.store.ledger import DynamoLedgerStore, LedgerStore
from gpufleet.store.objects import Checkpoints, S3Checkpoints
from gpufleet.store.safety_profiles import DynamoSafetyProfiles, SafetyProfileStore
from gpufleet.store.workflow import EventBridgeBus, EventBus
from gpufleet.tables import TableNames

#: (prompt) -> {"allowed": bool, "reason": str | None, ...}
PromptCheck = Callable[[str], dict[str, Any]]
#: (job_id, epoch) -> None; releases the attempt's quota usage and allocations
Release = Callable[[str, int], None]


class LifecycleSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs_table: str = "gpufleet-jobs"
    control_table: str = "gpufleet-control"
    ledger_table: str = "gpufleet-ledger"
    outputs_bucket: str = "gpufleet-outputs"
    checkpoints_bucket: str = "gpufleet-checkpoints"
    logs_bucket: str = "gpufleet-logs"
    webhook_queue_url: str = ""
    event_bus: str = ""
    heartbeat_seconds: int = Field(120, ge=1)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    billing: BillingPolicy = Field(default_factory=BillingPolicy)

    @property
    def tables(self) -> TableNames:
        return TableNames(self.jobs_table, self.control_table, self.ledger_table)

    @classmethod
    def from_env(cls) -> LifecycleSettings:
        env = os.environ
        t = TableNames.from_env()
        return cls(
            jobs_table=t.jobs,
            control_table=t.control,
            ledger_table=t.ledger,
            outputs_bucket=env.get("GPUFLEET_OUTPUTS_BUCKET", "gpufleet-outputs"),
            checkpoints_bucket=env.get("GPUFLEET_CHECKPOINTS_BUCKET", "gpufleet-checkpoints"),
            logs_bucket=env.get("GPUFLEET_LOGS_BUCKET", "gpufleet-logs"),
            webhook_queue_url=env.get("GPUFLEET_WEBHOOK_QUEUE_URL", ""),
            event_bus=env.get("GPUFLEET_EVENT_BUS", ""),
            heartbeat_seconds=int(env.get("GPUFLEET_HEARTBEAT_SECONDS", "120")),
            retry=RetryPolicy.from_env(),
            billing=BillingPolicy.from_env(),
        )


def _default_prompt_check(prompt: str) -> dict[str, Any]:
    from gpufleet.safety import PromptFilter  # heavy (transformers); loaded on first use

    verdict = PromptFilter.default().check(prompt)
    return {"allowed": bool(verdict.allowed), "reason": getattr(verdict, "reason", None)}


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
    #: the bus that hears ``JobPending`` (a scheduler pass now); None: the timer's pass picks the job up
    events: EventBus | None = None
    #: SQS client of the webhook queue (:func:`gpufleet.webhooks.delivery.enqueue`)
    sqs: Any = None
    rand: Callable[[], float] = field(default_factory=lambda: random.SystemRandom().random)
    prompt_check: PromptCheck = _default_prompt_check
    #: gives an attempt's capacity back; None: nothing to release
    release: Release | None = None

    @classmethod
    def build(
        cls, ddb, *, settings: LifecycleSettings, clock: Clock, s3=None, sqs=None, events=None,
        **collaborators: Any,
    ) -> Deps:
        """The Dynamo/S3/EventBridge stores over explicit clients, plus ``collaborators`` (rand, prompt_check,
        release)."""
        tables = settings.tables
        return cls(
            jobs=DynamoJobStore(ddb, tables, clock),
            ledger=DynamoLedgerStore(ddb, tables),
            safety=DynamoSafetyProfiles(ddb, tables.control, clock),
            settings=settings,
            clock=clock,
            checkpoints=S3Checkpoints(s3, settings.checkpoints_bucket) if s3 is not None else None,
            events=EventBridgeBus(events, settings.event_bus) if events is not None and settings.event_bus else None,
            sqs=sqs,
            **collaborators,
        )
