"""The finalize stage inside a Lambda: the workflow's ``FinalizeLambda`` task (handler ``lambdas/tasks/finalize.py``).

Contract:
- The event is ``{"job_id", "command"}``: the job and CompleteRun's ``finalize_command``, the very command the CPU
  Batch job (``FinalizeStage``) runs, ``python -m gpufleet.runtime --envelope-json <pointer envelope>``. Anything
  else — another program, an envelope file, a stage other than ``finalize``, another job's envelope — is refused
  (:class:`~gpufleet.errors.ValidationFailed`) before any work.
- :func:`run` runs :func:`gpufleet.runtime.main.main` in this process with that envelope: the same stage code,
  settings (``GPUFLEET_*`` of the function: the signing secret's id, tables, buckets), fencing on the job's
  epoch, logs pages, heartbeats and crash record as the Batch job, with the clients the Lambda container keeps
  (:class:`Clients`) and no signal handlers (the Lambda runtime owns the process). What stays loaded between
  invocations of a warm container — the interpreter, torch, the moderation models, the signing credentials'
  parsing — is what makes it fast; nothing of a job stays (the stage builds its context per call).
- Outcome: the stage's result line (``{"exit_code": "SUCCEEDED", ...}``) is returned on success. Any other exit
  code raises :class:`FinalizeFailed` (its message names the exit code and the stage's detail), which the workflow
  treats as the Batch job's failure is treated: ``Retry`` on ``States.ALL`` with the finalize interval and
  attempts, then ``MarkFinalizeFailed``. The stage's own writes are fenced, so a retry after a lost answer
  returns the recorded result (:mod:`gpufleet.runtime.finalize`, idempotent).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from gpufleet.envelope import Envelope, ExitCode
from gpufleet.errors import GpufleetError, ValidationFailed
from gpufleet.runtime.settings import RuntimeSettings

#: the one program FinalizeLambda runs: the runtime's entry point (CompleteRun's ``finalize_command``)
PROGRAM = ("python", "-m", "gpufleet.runtime", "--envelope-json")


class FinalizeFailed(GpufleetError):
    """The finalize stage ended with another exit code than SUCCEEDED (as a failed Batch job: retried, then
    MarkFinalizeFailed)."""

    type_slug = "finalize-failed"
    title = "The finalize stage failed"


@dataclass(frozen=True)
class Clients:
    """The AWS clients a warm container keeps between invocations (each built once)."""

    s3: Any
    dynamodb: Any
    secretsmanager: Any


def envelope_of(event: dict[str, Any]) -> Envelope:
    """The pointer envelope of the event's finalize command (module contract); ValidationFailed otherwise."""
    command = event.get("command")
    if not isinstance(command, list) or len(command) != len(PROGRAM) + 1 or tuple(command[:-1]) != PROGRAM:
        raise ValidationFailed("FinalizeLambda runs only `python -m gpufleet.runtime --envelope-json <envelope>`")
    try:
        envelope = Envelope.model_validate_json(command[-1])
    except ValueError as err:
        raise ValidationFailed(f"invalid envelope: {err}")
    if envelope.stage != "finalize":
        raise ValidationFailed(f"FinalizeLambda runs the finalize stage, not {envelope.stage!r}")
    if envelope.job_id != event.get("job_id"):
        raise ValidationFailed("the finalize command's envelope is another job's")
    return envelope


def run(event: dict[str, Any], clients: Clients, settings: RuntimeSettings) -> dict[str, Any]:
    """Run the finalize stage of ``event`` (module contract); the stage's result line, or FinalizeFailed."""
    from gpufleet.runtime.main import main

    envelope_of(event)
    out = io.StringIO()
    code = main(list(event["command"][3:]), settings=settings, s3=clients.s3, dynamodb=clients.dynamodb,
                secretsmanager=clients.secretsmanager, stdout=out, install_signals=False)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    result = json.loads(lines[-1]) if lines else {}
    if code != int(ExitCode.SUCCEEDED):
        name = ExitCode(code).name if code in {int(c) for c in ExitCode} else str(code)
        raise FinalizeFailed(f"finalize of {event['job_id']} exited {name}: {result.get('detail', '')}".strip(),
                             exit_code=name)
    return result
