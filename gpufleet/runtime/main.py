"""Entrypoint logic: parse the envelope, wire adapters, run one stage, map the outcome to an exit code.

Contract:
- ``main(argv, settings=None, s3=None, dynamodb=None, secretsmanager=None, stdout=None) -> int``: the process
  entry point (the finalize stage reads ``settings.signing_secret_id`` with ``secretsmanager``, default a
  client of the job's role);
  ``settings`` None loads :class:`RuntimeSettings` from the environment (once, here), and the
  stage gets everything it needs from this function (clock, clients, settings).
- A pointer envelope (no ``spec``: what the workflow passes to Batch) is completed with the spec read
  from the job item (:meth:`gpufleet.envelope.Envelope.with_spec`) before the stage starts; a job item
  without a valid spec is a USER_ERROR (NotFound/ValidationFailed), with no stage run.
- Outcome → :class:`ExitCode`: success 0; invalid envelope/spec, unknown
  model, failed user command → USER_ERROR; SIGTERM or spot notice →
  PREEMPTED (after checkpointing); ``cancel_requested`` → CANCELLED; a stale
  epoch on any write → FENCED; the spec's ``max_run_seconds`` passed (a timer started with the
  generate or container stage requests the stop, as a cancel does; no checkpoint) → TIMED_OUT;
  anything else → SYSTEM_ERROR.
- The last stdout line is ``{"event": "result", "exit_code": "<NAME>", ...stage result}``.
- On a node of an AWS Batch multi-node parallel job (a cloud gang: Batch's ``AWS_BATCH_JOB_NUM_NODES`` > 1 in
  ``environ``, default the process environment) an envelope without a gang role gets this node's
  (:func:`gpufleet.gang.batch_role`: rank, world size, the main node's address), so the stage hands the job the
  same torchrun variables as on-prem (:func:`gpufleet.gang.dist_env`), and records its member state on the attempt
  item (:func:`gpufleet.gang.batch_member_record`: ``running`` at the start, then ``succeeded`` or the exit code's
  name), best effort: a refused record is logged and never fails the stage. The main node (rank 0) watches the
  other members' records (:class:`gpufleet.runtime.batchgang.GangWatch`, every ``heartbeat_seconds``) and stops
  its stage with a failed member's exit code, which ends the whole job.
- ``batch``: the job's :class:`gpufleet.runtime.batchloop.BatchMember` when a warm worker runs several jobs
  as one denoising batch (each stage on a thread of its own, ``stdout``/``stderr`` its own log): the stage
  runs as alone but for its denoising steps, and its log handlers take only its own thread's lines.
- Log lines go to stderr and, in chunks, to the logs bucket; each carries the job's trace id (the envelope's
  ``traceparent``, :mod:`gpufleet.tracing`) when it has one.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import TextIO

from pydantic import ValidationError

from gpufleet import tracing
from gpufleet.clock import SystemClock
from gpufleet.envelope import Envelope, ExitCode
from gpufleet.errors import BadRequest, Cancelled, ConfigError, GpufleetError, NotFound, StaleEpoch, ValidationFailed
from gpufleet.gang import batch_member_record, batch_role
from gpufleet.runtime.context import StageContext, record_crash
from gpufleet.runtime.control import RunControl
from gpufleet.runtime.logs import S3LogHandler
from gpufleet.runtime.reporter import Heartbeat, JobItemReporter, MultiReporter, StreamReporter
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.spot import SpotWatcher
from gpufleet.spec import JobSpec
from gpufleet.store.clients import client as aws_client
from gpufleet.store.clients import default_region
from gpufleet.store.nodeapi import worker_adapters
from gpufleet.store.secrets import SecretsManagerReader

log = logging.getLogger("gpufleet.runtime")


def parse_envelope(argv: list[str] | None) -> Envelope:
    p = argparse.ArgumentParser(prog="python -m gpufleet.runtime", description="run one stage of a gpufleet job")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--envelope-json", help="the job envelope as JSON")
    g.add_argument("--envelope-file", help="path of a file holding the envelope JSON")
    args = p.parse_args(argv)
    raw = args.envelope_json
    if args.envelope_file:
        with open(args.envelope_file, encoding="utf-8") as fh:
            raw = fh.read()
    try:
        return Envelope.model_validate_json(raw)
    except ValidationError as err:
        raise ValidationFailed(f"invalid envelope: {err}")


def own_address() -> str:
    """This host's address as its name resolves (a Batch node's private IPv4 in ``awsvpc`` mode)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def with_batch_role(envelope: Envelope, environ) -> Envelope:
    """The envelope with this Batch node's gang role when it runs as a node of a multi-node parallel job."""
    if envelope.gang is not None or envelope.stage == "finalize":
        return envelope
    role = batch_role(environ, envelope.job_id, envelope.epoch, own_address)
    return envelope if role is None else envelope.model_copy(update={"gang": role})


def _record_member(job, role, state: str) -> None:
    """This Batch node's member state on the attempt item (best effort: a refusal is logged, never raised)."""
    try:
        job.record_attempt(batch_member_record(role, state))
    except Exception as err:  # noqa: BLE001 - StaleEpoch, throttling: the stage's own writes decide the outcome
        log.warning("could not record member %d as %s: %s", role.rank, state, err)


def console_formatter(trace_id: str | None) -> logging.Formatter:
    """The runtime's stderr lines (CloudWatch Logs on Batch, the agent's job log on a node): the message,
    then ``trace_id=<id>`` when the job has a trace (:mod:`gpufleet.tracing`)."""
    return logging.Formatter("%(message)s" + (f" trace_id={trace_id}" if trace_id else ""))


def _stored_spec(job) -> JobSpec:
    """The job's spec as the job item stores it (a pointer envelope names only the job and epoch)."""
    raw = job.get().get("spec")
    if raw is None:
        raise NotFound("the job item has no spec")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as err:
        raise ValidationFailed(f"invalid spec on the job item: {err}")


def _stage_runner(stage: str, sidecar: str = ""):
    if stage == "container" and sidecar == "tenant":  # a cloud container job's supervisor (gpufleet.batchdef)
        from gpufleet.runtime import sidecar as tenant_sidecar

        return tenant_sidecar.run
    if stage == "generate":
        from gpufleet.runtime import generate

        return generate.run
    if stage == "finalize":
        from gpufleet.runtime import finalize

        return finalize.run
    from gpufleet.runtime import container

    return container.run


class _OwnThread(logging.Filter):
    """Only the records logged by the thread that created it (a batch member's stage)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self.thread


def classify(err: BaseException) -> ExitCode:
    if isinstance(err, StaleEpoch):
        return ExitCode.FENCED
    if isinstance(err, Cancelled):
        return ExitCode.CANCELLED
    if isinstance(err, (ValidationFailed, BadRequest, NotFound)):
        return ExitCode.USER_ERROR
    return ExitCode.SYSTEM_ERROR


def main(argv: list[str] | None = None, *, settings: RuntimeSettings | None = None, s3=None, dynamodb=None,
         secretsmanager=None, stdout: TextIO | None = None, install_signals: bool = True,
         control: RunControl | None = None, stderr: TextIO | None = None, batch=None, environ=None) -> int:
    stream = StreamReporter("?", 0, stdout)
    try:
        envelope = parse_envelope(argv)
    except (ValidationFailed, OSError) as err:
        stream.event("result", exit_code=ExitCode.USER_ERROR.name, detail=str(err))
        return int(ExitCode.USER_ERROR)
    if settings is None:
        try:
            settings = RuntimeSettings.load()
        except ConfigError as err:
            stream.event("result", exit_code=ExitCode.SYSTEM_ERROR.name, detail=f"invalid settings: {err.detail}")
            return int(ExitCode.SYSTEM_ERROR)
    clock = SystemClock()

    control = control or RunControl()  # a warm worker passes the one whose signal handlers it installed
    if install_signals:
        control.install_signal_handlers()
    stream = StreamReporter(envelope.job_id, envelope.epoch, stdout)
    table = envelope.tables.get("jobs", settings.jobs_table)
    # On an on-prem node (node_api_url set) every job-item write is a node API call the server checks,
    # and objects are reached with the attempt's scoped credentials; on Batch, the job role's clients.
    try:  # a cloud supervisor's first call is the exchange of its token: refused (403/409), nothing runs
        job, objects = worker_adapters(table=table, job_id=envelope.job_id, epoch=envelope.epoch,
                                       node_api_url=settings.node_api_url, node_id=settings.node_id,
                                       region=default_region(), clock=clock, dynamodb=dynamodb, s3=s3,
                                       supervisor_token=settings.supervisor_token)
    except (GpufleetError, ConfigError) as err:
        code = classify(err)
        stream.event("result", exit_code=code.name, detail=err.detail)
        return int(code)
    if envelope.spec is None:  # a pointer envelope (Batch): the spec comes from the job item
        try:
            envelope = envelope.with_spec(_stored_spec(job))
        except GpufleetError as err:
            code = classify(err)
            stream.event("result", exit_code=code.name, detail=err.detail)
            return int(code)
    before = envelope.gang
    envelope = with_batch_role(envelope, os.environ if environ is None else environ)
    batch_member = envelope.gang if envelope.gang is not before else None
    reporter = MultiReporter(stream, JobItemReporter(job, control, settings.progress_interval_s, clock=clock,
                                                     background=True))

    trace = tracing.trace_id(envelope.traceparent)
    handler = S3LogHandler(objects, envelope.s3.bucket_logs, envelope.job_id, envelope.epoch,
                           max_lines=settings.log_chunk_lines, interval_s=settings.log_flush_s, clock=clock,
                           trace_id=trace, rank=envelope.gang.rank if envelope.gang else None,
                           world_size=envelope.gang.world_size if envelope.gang else 1)
    handler.setLevel(logging.INFO)
    console = logging.StreamHandler(stderr or sys.stderr)
    console.setLevel(logging.INFO)
    console.setFormatter(console_formatter(trace))
    if batch is not None:  # several jobs' stages share the process: each log takes its own thread's lines
        for h in (handler, console):
            h.addFilter(_OwnThread())
    root = logging.getLogger("gpufleet")
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    root.addHandler(console)
    secrets = None
    # the signing and watermark secrets, read with the finalize role
    if envelope.stage == "finalize" and (settings.signing_secret_id or settings.watermark_secret_id):
        secrets = SecretsManagerReader(secretsmanager or aws_client("secretsmanager", region=default_region()))
    ctx = StageContext(envelope, settings, objects, job, control, reporter, log, secrets=secrets, batch=batch)
    spot = None
    if settings.imds_endpoint and envelope.stage != "finalize":
        spot = SpotWatcher(lambda action: control.request(ExitCode.PREEMPTED, f"spot interruption notice: {action}"),
                           endpoint=settings.imds_endpoint, interval_s=settings.spot_poll_s).start()
    limit = envelope.spec.max_run_seconds if envelope.stage != "finalize" else None
    run_timer = None
    if limit:  # the attempt's maximum run time: stop the stage like a cancel, exit TIMED_OUT
        run_timer = threading.Timer(limit, control.request,
                                    (ExitCode.TIMED_OUT, f"maximum run time of {limit} s exceeded"))
        run_timer.daemon = True
        run_timer.start()
    code = ExitCode.SYSTEM_ERROR
    started = time.monotonic()
    gang_watch = None
    if batch_member is not None:
        _record_member(job, batch_member, "running")
        if batch_member.rank == 0 and hasattr(job, "get_attempt"):
            from gpufleet.runtime.batchgang import GangWatch

            gang_watch = GangWatch(job.get_attempt, batch_member.world_size, control,
                                   float(envelope.heartbeat_seconds)).start()
    try:
        log.info("stage %s of %s attempt %d epoch %d starting", envelope.stage, envelope.job_id,
                 envelope.attempt, envelope.epoch)
        with Heartbeat(reporter, envelope.heartbeat_seconds):
            try:
                code = _stage_runner(envelope.stage, settings.container_sidecar)(ctx)
            finally:
                reporter.close()  # no progress write in flight once the stage has its result
        if code is ExitCode.TIMED_OUT:
            ctx.result.setdefault("detail", control.detail)
    except (GpufleetError, ConfigError) as err:
        code = classify(err)
        ctx.result["detail"] = err.detail
        log.error("stage %s failed: %s (%s)", envelope.stage, err.detail, code.name)
    except Exception as err:  # the crash boundary: anything unexpected is a system error
        code = ExitCode.SYSTEM_ERROR
        ctx.result["detail"] = f"{type(err).__name__}: {err}"
        trace = traceback.format_exc()
        log.error("stage %s crashed: %s", envelope.stage, trace)
        record_crash(ctx, int(code), trace.splitlines())
    finally:
        if run_timer is not None:
            run_timer.cancel()
        if spot is not None:
            spot.stop()
        log.info("stage %s finished: %s", envelope.stage, code.name)
        if gang_watch is not None:
            gang_watch.stop()
        if batch_member is not None:
            _record_member(job, batch_member, "succeeded" if code is ExitCode.SUCCEEDED else code.name.lower())
        root.removeHandler(handler)
        root.removeHandler(console)
        handler.close()
    if settings.supervisor_token:  # a cloud supervisor reports its attempt itself, as an on-prem agent does
        from gpufleet.runtime.sidecar import report_outcome

        report_outcome(job, code, ctx.result, time.monotonic() - started, envelope.spec.resources.gpus, log)
    stream.event("result", exit_code=code.name, **ctx.result)
    return int(code)
