"""Settings and clients of the lifecycle task Lambdas.

Contract: :class:`LifecycleSettings` is validated at start-up from the environment the CDK
orchestration stack sets (names below); :class:`Deps` bundles the boto3 clients, the clock,
the random source and the pluggable collaborators (prompt filter, quota release). Handlers
build ``Deps`` once per container with :func:`Deps.from_env`; tests build it explicitly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.clock import Clock, SystemClock
from gpufleet.lifecycle.billing import BillingPolicy
from gpufleet.lifecycle.retry import RetryPolicy
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


def _default_release(ddb, names: TableNames) -> Release:
    def release(job_id: str, epoch: int) -> None:
        from gpufleet.store.placements import release as release_attempt

        release_attempt(ddb, job_id, epoch, names=names)

    return release


@dataclass
class Deps:
    ddb: Any
    settings: LifecycleSettings = field(default_factory=LifecycleSettings)
    sqs: Any = None
    s3: Any = None
    batch: Any = None
    sfn: Any = None
    events: Any = None
    clock: Clock = field(default_factory=SystemClock)
    rand: Callable[[], float] = field(default_factory=lambda: random.SystemRandom().random)
    prompt_check: PromptCheck = _default_prompt_check
    release: Release | None = None

    def __post_init__(self) -> None:
        if self.release is None:
            self.release = _default_release(self.ddb, self.settings.tables)

    @classmethod
    def from_env(cls) -> Deps:
        from gpufleet.store.dynamo import client

        return cls(
            ddb=client("dynamodb"),
            settings=LifecycleSettings.from_env(),
            sqs=client("sqs"),
            s3=client("s3"),
            batch=client("batch"),
            sfn=client("stepfunctions"),
            events=client("events"),
        )
