"""What a stage needs, built once by the entrypoint and injected (tests build it directly)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from gpufleet import crash
from gpufleet.envelope import Envelope, ExitCode
from gpufleet.runtime.control import RunControl
from gpufleet.runtime.reporter import Reporter
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.jobitem import JobItem
from gpufleet.store.objectstore import ObjectStore
from gpufleet.store.secrets import SecretReader


@dataclass
class StageContext:
    envelope: Envelope
    settings: RuntimeSettings
    objects: ObjectStore
    job: JobItem
    control: RunControl
    reporter: Reporter
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("gpufleet.runtime"))
    result: dict = field(default_factory=dict)  # stage output, printed as the final JSON line
    #: Secrets Manager reads (finalize's signing secret); None when the stage needs none
    secrets: SecretReader | None = None
    #: the job's place in a denoising batch (:class:`gpufleet.runtime.batchloop.BatchMember`); None: alone
    batch: Any = None


def record_crash(ctx: StageContext, exit_code: int, lines: list[str]) -> None:
    """Record the attempt's ``crash`` (:mod:`gpufleet.crash`: exit code + fingerprint of the tail), fenced,
    so ClassifyFailure can tell a deterministic crash of the job's spec from a broken node. Best effort:
    a crash that cannot be recorded is simply not compared."""
    rec = crash.record(exit_code, lines)
    ctx.result["crash"] = {"fingerprint": rec["fingerprint"], "exit_code": exit_code}
    try:
        ctx.job.record_attempt({"crash": rec})
    except Exception as err:  # noqa: BLE001 - never mask the crash being reported
        ctx.log.warning("could not record the crash on the attempt: %s", err)


def refined_stop(ctx: StageContext) -> ExitCode | None:
    """The stage's stop reason, a SIGTERM's checked first: it may be a cancel (AWS Batch's TerminateJob, which the
    API sends for one, signals SIGTERM as a spot reclaim or a drain does). One heartbeat reads the job item, and a
    cancel seen there wins (:class:`gpufleet.runtime.control.RunControl`): the stage then stops with the cancel's
    grace and exits CANCELLED, not PREEMPTED. Any other reason is returned as it is, without a read."""
    if ctx.control.preempted_by_signal:
        try:
            ctx.reporter.heartbeat()
        except Exception as err:  # noqa: BLE001 - the stop goes on as a preemption whatever the read did
            ctx.log.warning("could not read the job after SIGTERM (%s); stopping as preempted", err)
    return ctx.control.stop_reason()
