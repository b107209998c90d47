"""Failure classification (pure): worker errors, Batch status reasons and timeouts → a :class:`Failure`.

Inputs are what a Step Functions ``Catch`` with ``ResultPath: $.error`` records:
``{"Error": name, "Cause": text}``. Sources:

- an on-prem worker's ``SendTaskFailure``: ``Error`` is an :class:`~gpufleet.envelope.ExitCode`
  name, ``Cause`` is JSON ``{"epoch", "node", "detail", "gpu_seconds"?}``;
- ``States.Timeout`` / ``States.HeartbeatTimeout``: the worker went silent (moto reports a
  heartbeat timeout as ``States.Timeout``; both mean the same here) → system failure, worker lost;
- ``batch:submitJob.sync`` failing: ``States.TaskFailed`` with the Batch job description as
  ``Cause`` (PascalCase on AWS, camelCase where it is not normalised): the container's exit code
  follows the runtime contract; a host or Spot termination reason is a preemption; Batch stopping the attempt
  at its ``attemptDurationSeconds`` (the spec's ``max_run_seconds`` with a margin, PrepareRun: the runtime
  did not stop itself in time) is TIMED_OUT, whatever the container exited with;
- a ``CANCELLED`` failure sent on the placement token by :func:`gpufleet.lifecycle.cancel.propagate`,
  or the task Lambdas raising ``Cancelled``;
- an ``EXPIRED`` failure the scheduler pass sent on the placement token (the spec's ``deadline``
  passed before the job ever started): EXPIRED, not charged;
- exit code / error ``TIMED_OUT`` (the runtime or the on-prem agent stopped an attempt that ran past the
  spec's ``max_run_seconds``): TIMED_OUT, through the exit-code contract like the others;
- a task Lambda raising one of :data:`USER_ERRORS` (CollectOutputs: ``OutputTooLarge``): the job's
  own failure, USER, the reason being the Lambda's ``errorMessage``.

``crash`` is the failed attempt's recorded crash (:mod:`gpufleet.crash`, the attempt item's
``crash``): a SYSTEM failure of a worker that was not lost carries its ``fingerprint``, which
:func:`gpufleet.lifecycle.decide.decide` compares across workers.

A job with ``cancel_requested`` is always classified CANCELLED, whatever the worker said.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.envelope import ExitCode
from gpufleet.placement import Placement
from gpufleet.status import FailureClass

TIMEOUT_ERRORS = frozenset({"States.Timeout", "States.HeartbeatTimeout"})
#: errors a task Lambda raises for a failure of the job's own making
USER_ERRORS = frozenset({"OutputTooLarge"})

#: Batch's status reason (lower-cased substring) when it stopped an attempt at its ``attemptDurationSeconds``
#: ("Job attempt duration exceeded timeout")
ATTEMPT_TIMEOUT_REASON = "attempt duration exceeded"

#: Batch status reasons (lower-cased substrings) that mean the capacity was taken away.
PREEMPTION_REASONS = (
    "host ec2",  # "Host EC2 (instance i-...) terminated."
    "spot",
    "capacity",
    "instance terminated",
    "interruption",
)


@dataclass(frozen=True)
class Failure:
    """One failed attempt, classified.

    ``worker`` identifies the machine that ran it (node id on-prem, pool/instance in the
    cloud) or is None when unknown; ``lost`` is True when the worker went silent and must
    be fenced; ``wall_seconds`` is how long the attempt ran, when known.
    """

    cls: FailureClass
    reason: str
    worker: str | None = None
    lost: bool = False
    wall_seconds: float | None = None
    epoch: int | None = None
    #: fingerprint of the crash the worker recorded (gpufleet.crash), SYSTEM failures only
    fingerprint: str | None = None


def _json(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text.strip().startswith("{"):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _get(d: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in d:
            return d[n]
    return None


def _batch_failure(desc: dict[str, Any]) -> Failure:
    status_reason = str(_get(desc, "StatusReason", "statusReason") or "")
    container = _get(desc, "Container", "container") or {}
    exit_code = _get(container, "ExitCode", "exitCode")
    if exit_code is None:  # a multi-node parallel job (a cloud gang): the main node's, on the last attempt
        attempts = _get(desc, "Attempts", "attempts") or [{}]
        last = _get(attempts[-1], "Container", "container") or {}
        exit_code = _get(last, "ExitCode", "exitCode")
        container = {**last, **container}
    container_reason = str(_get(container, "Reason", "reason") or "")
    started = _get(desc, "StartedAt", "startedAt")
    stopped = _get(desc, "StoppedAt", "stoppedAt")
    wall = (float(stopped) - float(started)) / 1000.0 if started and stopped and stopped >= started else None
    worker = (
        _get(container, "ContainerInstanceArn", "containerInstanceArn")
        or _get(container, "LogStreamName", "logStreamName")
        or _get(desc, "JobId", "jobId")
    )
    reason = "; ".join(r for r in (status_reason, container_reason) if r) or "batch job failed"
    if ATTEMPT_TIMEOUT_REASON in status_reason.lower():  # whatever the stopped runtime exited with (SIGTERM: PREEMPTED)
        return Failure(FailureClass.TIMED_OUT, reason, worker, False, wall)
    if exit_code is not None:
        code = ExitCode.classify(int(exit_code))
        if code is not ExitCode.SYSTEM_ERROR:
            return Failure(code.failure_class(), f"exit {int(exit_code)}: {reason}", worker, False, wall)
    lowered = reason.lower()
    if any(marker in lowered for marker in PREEMPTION_REASONS):
        return Failure(FailureClass.PREEMPTED, reason, worker, False, wall)
    return Failure(FailureClass.SYSTEM, reason, worker, False, wall)


def classify(
    error: dict[str, Any] | None, placement: Placement | Mapping[str, Any] | None, *, cancel_requested: bool,
    crash: Mapping[str, Any] | None = None,
) -> Failure:
    """Classify a caught error of the Run (or AwaitPlacement) state.

    ``placement`` is the attempt's placement (may be None when the failure happened before
    one existed). Never raises: anything unrecognised is a system failure.
    """
    error = error or {}
    doc = Placement.parse(placement)
    name = str(error.get("Error") or "")
    cause_text = error.get("Cause")
    cause = _json(cause_text)
    node = (doc.node or doc.pool or None) if doc else None
    epoch = doc.epoch if doc else None

    if name in ExitCode.__members__:
        code = ExitCode[name]
        gpu_s = cause.get("wall_seconds", cause.get("gpu_seconds"))
        failure = Failure(
            code.failure_class() or FailureClass.SYSTEM,
            str(cause.get("detail") or name),
            cause.get("node") or node,
            False,
            float(gpu_s) if gpu_s is not None else None,
            cause.get("epoch", epoch),
        )
    elif name in TIMEOUT_ERRORS:
        failure = Failure(FailureClass.SYSTEM, "worker stopped heartbeating", node, True, None, epoch)
    elif name == "States.TaskFailed" and cause:
        failure = _batch_failure(cause)
        failure = Failure(failure.cls, failure.reason, failure.worker or node, False, failure.wall_seconds, epoch)
    elif name in ("Cancelled", "CancelledError"):
        failure = Failure(FailureClass.CANCELLED, "cancelled", node, False, None, epoch)
    elif name == "EXPIRED":  # the scheduler failed the placement token: the spec's deadline passed
        failure = Failure(FailureClass.EXPIRED, str(cause.get("detail") or "the deadline passed before the job started"),
                          node, False, None, epoch)
    elif name in USER_ERRORS:
        failure = Failure(FailureClass.USER, str(cause.get("errorMessage") or name)[:500], node, False, None, epoch)
    else:
        detail = str(cause_text or name or "unknown failure")[:500]
        failure = Failure(FailureClass.SYSTEM, detail, node, False, None, epoch)

    if cancel_requested and failure.cls is not FailureClass.CANCELLED:
        return Failure(FailureClass.CANCELLED, "cancelled by user", failure.worker, failure.lost,
                       failure.wall_seconds, failure.epoch)
    if failure.cls is FailureClass.SYSTEM and not failure.lost and crash and crash.get("fingerprint"):
        failure = replace(failure, fingerprint=str(crash["fingerprint"]))
    return failure
