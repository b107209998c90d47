"""From a finished child process to the Step Functions report (pure).

Contract (docs/contracts.md): success → ``SendTaskSuccess`` with output
``{"epoch", "gpu_seconds", "generated"}``; anything else → ``SendTaskFailure``
with ``error`` = an :class:`gpufleet.envelope.ExitCode` name and ``cause`` =
JSON ``{"epoch", "node", "detail"}``.

The agent's own decision outranks the exit code: a job the agent cancelled is
CANCELLED, a job fenced off is FENCED, and a job the agent stopped for a drain
that did not finish is PREEMPTED (so it is rescheduled without using the failure
budget), whatever code the killed process returned. A drained job that finished
anyway is a success.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.envelope import ExitCode


class Stop(StrEnum):
    """Why the agent ended a job itself (``NONE``: it ended on its own)."""

    NONE = "none"
    CANCELLED = "cancelled"
    DRAINED = "drained"
    FENCED = "fenced"
    ABANDONED = "abandoned"  # the workflow gave up on the task (token timed out): nothing to report
    TIMED_OUT = "timed_out"  # the job ran past its spec's max_run_seconds: stopped like a cancel


@dataclass(frozen=True)
class Report:
    success: bool
    error: str | None
    output: dict[str, Any] | None
    cause: dict[str, Any] | None

    @property
    def outcome(self) -> str:
        """Metric label: SUCCEEDED or the error name."""
        return "SUCCEEDED" if self.success else str(self.error)

    def cause_json(self) -> str:
        return json.dumps(self.cause, sort_keys=True)

    def output_json(self) -> str:
        return json.dumps(self.output, sort_keys=True)


def describe_returncode(returncode: int) -> str:
    """``Popen.returncode`` in words: 'exit 20' or 'killed by SIGSEGV'."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def classify(returncode: int, stop: Stop) -> ExitCode:
    """The contract code for a child that ended with ``returncode`` after the agent's ``stop`` decision."""
    if stop is Stop.CANCELLED:
        return ExitCode.CANCELLED
    if stop is Stop.FENCED:
        return ExitCode.FENCED
    if stop is Stop.TIMED_OUT:
        return ExitCode.TIMED_OUT
    code = ExitCode.classify(returncode) if returncode >= 0 else ExitCode.SYSTEM_ERROR
    if stop is Stop.DRAINED and code is not ExitCode.SUCCEEDED:
        return ExitCode.PREEMPTED
    return code


def build_report(
    returncode: int,
    stop: Stop,
    *,
    epoch: int,
    node: str,
    gpu_seconds: float,
    generated: dict[str, Any] | None = None,
    detail: str = "",
) -> Report:
    code = classify(returncode, stop)
    if code is ExitCode.SUCCEEDED:
        return Report(
            success=True,
            error=None,
            output={"epoch": epoch, "gpu_seconds": round(gpu_seconds, 3), "generated": generated or {}},
            cause=None,
        )
    words = describe_returncode(returncode)
    return Report(
        success=False,
        error=code.name,
        output=None,
        cause={"epoch": epoch, "node": node, "detail": f"{detail}; {words}" if detail else words},
    )
