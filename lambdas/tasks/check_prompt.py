"""Step Functions task `CheckPrompt`: thin handler over :func:`gpufleet.lifecycle.steps.check_prompt`.

Besides the tier-1 prompt decision, the step freezes the tenant's tier-2 safety settings onto the
job item (``safety``; :mod:`gpufleet.store.safety_profiles`); it reads the tenant's profile from the
control table (``SAFETY#<tenant>`` / ``SAFETY``, GetItem) and updates the job item (UpdateItem).
"""

from __future__ import annotations

from typing import Any

from gpufleet.lifecycle import steps
from gpufleet.lifecycle.settings import warm_prompt_check
from lambdas.tasks._deps import deps


def init() -> None:
    """The init phase, run ahead of the first event where the runtime offers one (the embedded stack at start,
    :meth:`gpufleet.local.lambda_runner.LambdaRunner.initialize`): load this function's prompt filter."""
    warm_prompt_check(deps().settings.prompt_policy)


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return steps.check_prompt(deps(), event)
