"""Step Functions task `AwaitPlacement`: thin handler over :func:`gpufleet.lifecycle.steps.await_placement`."""

from __future__ import annotations

from typing import Any

from gpufleet.lifecycle import steps
from lambdas.tasks._deps import deps


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return steps.await_placement(deps(), event["job_id"], event["token"])
