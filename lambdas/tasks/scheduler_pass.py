"""Scheduler pass Lambda (timer and events): thin handler over :func:`gpufleet.scheduler.passes.run_pass`.

One pass at a time is enforced by the lease inside ``run_pass``; a concurrent
invocation returns ``{"skipped": true}``. The scheduler configuration comes from the
deployment setting ``GPUFLEET_SCHEDULER_CONFIG`` (JSON; absent = the defaults), validated
once per process with the rest of :class:`SchedulerPassSettings` (an invalid one fails every invocation with
``ConfigError``). Table names and pools come from the deployment environment (``GPUFLEET_*_TABLE``,
``GPUFLEET_POOLS``). The pass's report is logged and its metrics are written to stdout as EMF
(:func:`gpufleet.scheduler.passes.emit_report`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from gpufleet.clock import SystemClock
from gpufleet.metrics import Metrics
from gpufleet.scheduler.framework import SchedulerConfig, parse_config
from gpufleet.scheduler.passes import run_pass
from gpufleet.settings import PoolSettings, StorageSettings
from gpufleet.store.clients import client
from gpufleet.store.scheduling import pass_stores


class SchedulerPassSettings(StorageSettings, PoolSettings):
    """``GPUFLEET_*`` of the scheduler pass; ``GPUFLEET_SCHEDULER_CONFIG`` is JSON (unset or empty: defaults)."""

    scheduler_config: Annotated[SchedulerConfig, NoDecode] = Field(default_factory=SchedulerConfig)
    #: the timer's period: what the queue view's estimated starts assume between passes
    scheduler_interval_s: float = Field(60.0, gt=0)
    #: how many of a pass's single-item writes (wait reasons, backoffs, preemption requests) are in flight at once
    scheduler_write_parallelism: int = Field(16, ge=1, le=64)

    @field_validator("scheduler_config", mode="before")
    @classmethod
    def _config(cls, v: Any) -> Any:
        if isinstance(v, str):
            return parse_config(v) if v else SchedulerConfig()
        return v


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any]:
    return client("dynamodb"), client("stepfunctions")


@lru_cache(maxsize=1)
def _config() -> SchedulerPassSettings:
    return SchedulerPassSettings.load()


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    settings = _config()
    ddb, sfn = _clients()
    stores = pass_stores(ddb, settings.tables, sfn=sfn)
    report = run_pass(stores, pools=settings.pools, clock=SystemClock(), config=settings.scheduler_config,
                      metrics=Metrics(), pass_interval_s=settings.scheduler_interval_s,
                      write_parallelism=settings.scheduler_write_parallelism)
    return report.as_dict()
