"""Scheduler pass Lambda (timer and events): thin handler over :func:`gpufleet.scheduler.passes.run_pass`.

The pass runs for shard ``event["shard"]`` (default 0) of ``GPUFLEET_SCHEDULER_SHARDS`` (default 1: one pass owns
everything; :mod:`gpufleet.scheduler.shards`): each shard has its own EventBridge rules whose input names it. One
pass per shard at a time is enforced by the shard's lease inside ``run_pass``; a concurrent invocation for the same
shard returns ``{"skipped": true}``. An event naming no valid shard fails with ``ConfigError``.
Commits run in ``GPUFLEET_SCHEDULER_COMMIT_LANES`` lanes (default 4), at most
``GPUFLEET_SCHEDULER_WRITE_PARALLELISM`` at once. The scheduler configuration comes from the
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
from gpufleet.errors import ConfigError
from gpufleet.metrics import Metrics
from gpufleet.scheduler.framework import SchedulerConfig, parse_config
from gpufleet.scheduler.passes import run_pass
from gpufleet.scheduler.shards import MAX_SHARDS, PassShard
from gpufleet.settings import PoolSettings, StorageSettings
from gpufleet.store.clients import client
from gpufleet.store.scheduling import pass_stores


class SchedulerPassSettings(StorageSettings, PoolSettings):
    """``GPUFLEET_*`` of the scheduler pass; ``GPUFLEET_SCHEDULER_CONFIG`` is JSON (unset or empty: defaults)."""

    scheduler_config: Annotated[SchedulerConfig, NoDecode] = Field(default_factory=SchedulerConfig)
    #: the timer's period: what the queue view's estimated starts assume between passes
    scheduler_interval_s: float = Field(60.0, gt=0)
    #: how many of a pass's single-item writes (wait reasons, backoffs, preemption requests) are in flight at once;
    #: also the most commit lanes run side by side
    scheduler_write_parallelism: int = Field(16, ge=1, le=64)
    #: how many passes run side by side, each over its shard (the deployment's EventBridge rules, one per shard)
    scheduler_shards: int = Field(1, ge=1, le=MAX_SHARDS)
    #: a pass's commit lanes (each with its own quota escrow item)
    scheduler_commit_lanes: int = Field(4, ge=1, le=32)

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


def shard_of(event: dict[str, Any] | None, count: int, now: float) -> PassShard:
    """The shard an invocation runs for: ``event["shard"]`` (absent: 0) of ``count``."""
    raw = (event or {}).get("shard", 0)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < count:
        raise ConfigError(f"scheduler pass: shard {raw!r} is not one of 0..{count - 1}")
    return PassShard.at(raw, count, now)


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    settings = _config()
    ddb, sfn = _clients()
    clock = SystemClock()
    shard = shard_of(event, settings.scheduler_shards, clock.now())
    stores = pass_stores(ddb, settings.tables, sfn=sfn, shard=shard)
    report = run_pass(stores, pools=settings.pools, clock=clock, config=settings.scheduler_config,
                      metrics=Metrics(), pass_interval_s=settings.scheduler_interval_s,
                      write_parallelism=settings.scheduler_write_parallelism, shard=shard,
                      lanes=settings.scheduler_commit_lanes,
                      lane_parallelism=min(settings.scheduler_commit_lanes, settings.scheduler_write_parallelism))
    return report.as_dict()
