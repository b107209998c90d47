"""Scheduler pass Lambda (timer and events): thin handler over :func:`gpufleet.scheduler.passes.run_pass`.

One pass at a time is enforced by the lease inside ``run_pass``; a concurrent
invocation returns ``{"skipped": true}``. The scheduler configuration comes from the
deployment setting ``GPUFLEET_SCHEDULER_CONFIG`` (JSON; absent = the defaults), validated
once per process (an invalid one fails every invocation with ``ConfigError``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from gpufleet.scheduler.framework import SchedulerConfig, load_config
from gpufleet.scheduler.passes import run_pass
from gpufleet.store.dynamo import client


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any]:
    return client("dynamodb"), client("stepfunctions")


@lru_cache(maxsize=1)
def _config() -> SchedulerConfig:
    return load_config(os.environ)


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    config = _config()
    ddb, sfn = _clients()
    return run_pass(ddb, sfn=sfn, config=config).as_dict()
