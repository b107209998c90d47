"""Step Functions task `MarkRejected / MarkFinalizeFailed`: thin handler over :func:`gpufleet.lifecycle.steps.mark_terminal`."""

from __future__ import annotations

from typing import Any

from gpufleet.lifecycle import steps
from lambdas.tasks._deps import deps


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return steps.mark_terminal(deps(), event["state"], event["status"], event.get("stage") or "finalize")
