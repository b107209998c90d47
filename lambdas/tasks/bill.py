"""Step Functions task `Bill`: thin handler over :func:`gpufleet.lifecycle.steps.bill`."""

from __future__ import annotations

from typing import Any

from gpufleet.lifecycle import steps
from lambdas.tasks._deps import deps


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return steps.bill(deps(), event["job_id"])
