"""Step Functions task `CollectOutputs`: thin handler over :func:`gpufleet.lifecycle.steps.collect_outputs`."""

from __future__ import annotations

from typing import Any

from gpufleet.lifecycle import steps
from lambdas.tasks._deps import deps


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return steps.collect_outputs(deps(), event)
