"""Scheduler pass Lambda (timer and events): thin handler over :func:`gpufleet.scheduler.passes.run_pass`.

One pass at a time is enforced by the lease inside ``run_pass``; a concurrent
invocation returns ``{"skipped": true}``. The scheduler configuration comes from the
deployment setting ``GPUFLEET_SCHEDULER_CONFIG`` (JSON; absent = the defaults), validated
once per process (an invalid one fails every invocation with ``ConfigError``). Table names and pools come
from the deployment environment (``GPUFLEET_*_TABLE``, ``GPUFLEET_POOLS``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from gpufleet.clock import SystemClock
from gpufleet.pools import load_pools
from gpufleet.scheduler.framework import SchedulerConfig, load_config
from gpufleet.scheduler.passes import run_pass
from gpufleet.store.clients import client
from gpufleet.store.scheduling import pass_stores
from gpufleet.tables import TableNames


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any]:
    return client("dynamodb"), client("stepfunctions")


@lru_cache(maxsize=1)
def _config() -> SchedulerConfig:
    return load_config(os.environ)


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    config = _config()
    ddb, sfn = _clients()
    stores = pass_stores(ddb, TableNames.from_env(), sfn=sfn)
    return run_pass(stores, pools=load_pools(), clock=SystemClock(), config=config).as_dict()
