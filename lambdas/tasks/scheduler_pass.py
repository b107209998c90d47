"""Scheduler pass Lambda (timer and events): thin handler over :func:`gpufleet.scheduler.passes.run_pass`.

One pass at a time is enforced by the lease inside ``run_pass``; a concurrent
invocation returns ``{"skipped": true}``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpufleet.scheduler.passes import run_pass
from gpufleet.store.dynamo import client


@lru_cache(maxsize=1)
def _clients() -> tuple[Any, Any]:
    return client("dynamodb"), client("stepfunctions")


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    ddb, sfn = _clients()
    return run_pass(ddb, sfn=sfn).as_dict()
