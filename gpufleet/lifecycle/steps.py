"""One function per Step Functions task of the lifecycle (I/O through :class:`Deps`).

Each takes the execution state the task received (the whole ``$``) and returns the task
result the definition stores (``$.<path>.value``). Contracts per function below; the state
list is in docs/contracts.md. Every task first loads the job (typed:
:class:`~gpufleet.jobrecord.JobRecord`, so the spec's defaults are :class:`~gpufleet.spec.JobSpec`'s)
and raises
:class:`~gpufleet.errors.Cancelled` if it is ``cancel_requested`` (that is how cancellation
reaches every state). Metrics (:mod:`gpufleet.metrics.catalog`, through ``deps.metrics``): CompleteRun and
ClassifyFailure write the attempt's ``GpuSeconds``, ClassifyFailure ``AttemptFailures``, Bill
``JobsEnded``, MarkFinalizeFailed ``FinalizeFailed``, MarkFailed ``WorkflowFailed``. Terminal writers store ``final`` on the job — ``{"outcome", "epoch",
"gpu_seconds", "pool", "price_per_gpu_hour", "reason"}`` — which :func:`bill` charges from.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from gpufleet import tracing
from gpufleet.batchdef import attempt_duration_seconds, node_overrides, resource_requirements
from gpufleet.clock import iso
from gpufleet.envelope import Envelope, S3Locations
from gpufleet.errors import Cancelled, Conflict, InvalidTransition, NotFound, OutputTooLarge, StaleEpoch, TransientError
from gpufleet.finalize_route import finalize_pixels
from gpufleet.jobrecord import JobRecord
from gpufleet.lifecycle import jobio
from gpufleet.lifecycle.billing import Charge, Outcome, charge_for, gpu_seconds
from gpufleet.lifecycle.classify import classify
from gpufleet.lifecycle.decide import Accounting, attempt_nodes, decide
from gpufleet.lifecycle.settings import Deps
from gpufleet.metrics import catalog as M
from gpufleet.phases import FINALIZE_PHASE, attempt_marks, summary
from gpufleet.placement import Placement
from gpufleet.spec import VideoGenerate
from gpufleet.status import FailureClass, JobStatus
from gpufleet.store.guard import Guard
from gpufleet.store.provenance import ProvenanceEntry
from gpufleet.webhooks import delivery

S = JobStatus
_log = logging.getLogger(__name__)
RUNNABLE = (S.SCHEDULED, S.RUNNING)

# What each job-moving step writes on its job item besides a status move (gpufleet.store.jobs.TRANSITION_ATTRIBUTES),
# its epoch fence (gpufleet.store.fencing.FENCE_ATTRIBUTES) and a release of its attempt
# (gpufleet.store.placements.RELEASE_ATTRIBUTES): its move's ``extra`` and ``remove`` and its fenced updates. infra.grants
# binds each step's UpdateItem to these (``dynamodb:Attributes``); a new attribute goes here, or the policy survey
# (tests/infra/test_infra_calls_vs_policy.py) finds the write denied.
#: AwaitPlacement: the placement token (a move to PENDING, or a fenced update of a PENDING job; both not cancelled)
AWAIT_PLACEMENT_WRITES = ("placement_token",)
#: CompleteRun: the run's record and the worker's generated pointer (and ResumeFinalize's ``last_run``)
COMPLETE_RUN_WRITES = ("last_run", "generated")
#: ClassifyFailure: the retry accounting (``issue_epoch``, ``fenced_update`` or the terminal move), ``final``, and
#: the placement token a terminal move removes
CLASSIFY_FAILURE_WRITES = ("system_failures", "preemptions", "last_failure", "crashed_workers", "failed_nodes",
                           "crashes", "final", "placement_token")
#: MarkTerminal: ``final`` (REJECTED, FAILED)
MARK_TERMINAL_WRITES = ("final",)
#: Publish: ``final``, the finalize phase in ``last_run``, ``published_at``; BLOCKED removes ``output``
PUBLISH_WRITES = ("final", "last_run", "published_at", "output")


def _job(deps: Deps, job_id: str) -> JobRecord:
    return deps.jobs.get_record(job_id)


def _value(state: dict[str, Any], key: str) -> dict[str, Any]:
    return ((state.get(key) or {}).get("value")) or {}


def _final(outcome: Outcome, epoch: int, gpu_secs: float, placement: Placement | None, reason: str | None) -> dict:
    return {
        "outcome": outcome.value,
        "epoch": int(epoch),
        "gpu_seconds": float(gpu_secs),
        "pool": placement.pool if placement else None,
        "price_per_gpu_hour": placement.price_per_gpu_hour if placement else 0.0,
        "reason": reason,
    }


def _release(deps: Deps, job_id: str, epoch: int, *, announce: bool = True) -> None:
    """Give back attempt ``epoch``'s GPUs and quota; when this call freed them and ``announce``, wake the
    scheduler (``CapacityFreed``), so a waiting job starts now rather than at the timer's next pass."""
    if epoch > 0 and deps.release is not None:
        try:
            freed = deps.release(job_id, epoch)
        except NotFound:  # an epoch issued to fence, never placed: nothing is booked
            return
        if freed and announce:
            _announce(deps, "CapacityFreed", {"job_id": job_id, "epoch": epoch})


def _unseen_attempt(job: JobRecord, placement: Placement | None) -> int:
    """The epoch of a placement the workflow never saw, else 0: the job is SCHEDULED/RUNNING at an epoch its
    state holds no placement for (the scheduler committed after a cancel or timeout had already ended the wait
    for a placement). Ending the job gives that attempt back too (release is idempotent)."""
    if placement is None and job.status in RUNNABLE and job.current_epoch > 0:
        return job.current_epoch
    return 0


def _ended(deps: Deps, job_id: str) -> None:
    """The job is terminal: its checkpoints may now expire (bucket lifecycle rule on the tag)."""
    if deps.checkpoints is not None:
        deps.checkpoints.mark_ended(job_id)


# ----------------------------------------------------------------------------- CheckPrompt


def check_prompt(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """Tier-1 prompt safety. Returns ``{"allowed", "reason"}``; container jobs are always allowed. The
    ``prompt_checked`` event records the decision with its category, score and policy version (an allowed prompt's
    nearest category and its score as ``nearest_category`` / ``nearest_score``: it was put in no category).

    For a video job it first freezes the tenant's tier-2 settings onto the job item (``safety``,
    :mod:`gpufleet.store.safety_profiles`): the finalize stage moderates with those, whatever the
    operator changes later."""
    job = _job(deps, state["job_id"])
    jobio.ensure_not_cancelled(job)
    workload = job.spec.workload
    if not isinstance(workload, VideoGenerate):
        return {"allowed": True, "reason": None}
    frozen = deps.jobs.freeze_safety(job.job_id, deps.safety.resolve(job.tenant))
    text = " ".join(p for p in (workload.prompt, workload.negative_prompt) if p)
    verdict = deps.prompt_check(text)
    allowed = bool(verdict.get("allowed"))
    detail = {"allowed": allowed, "reason": verdict.get("reason"), "safety_profile_version": frozen.profile_version}
    detail.update({k: verdict[k] for k in ("category", "score", "policy_version") if verdict.get(k) is not None})
    if allowed and "category" in detail:  # an allowed prompt is in no category: its nearest one is named as such
        detail["nearest_category"] = detail.pop("category")
        if "score" in detail:
            detail["nearest_score"] = detail.pop("score")
    deps.jobs.append_event(job.job_id, "prompt_checked", detail)
    return {"allowed": allowed, "reason": verdict.get("reason")}


# ----------------------------------------------------------------------------- AwaitPlacement


def await_placement(deps: Deps, job_id: str, token: str) -> dict[str, Any]:
    """Park the job: store the placement token and move it to PENDING (from QUEUED, SCHEDULED or
    RUNNING after a failed attempt; a job already PENDING only gets the new token). The write is
    conditioned on ``cancel_requested`` being unset, so a concurrent cancel either sees the token
    (and fails it) or makes this raise :class:`Cancelled`."""
    job = _job(deps, job_id)
    jobio.ensure_not_cancelled(job)
    status = job.status
    if status is S.PENDING:
        try:
            deps.jobs.fenced_update(
                job_id, job.current_epoch, {"placement_token": token},
                guard=Guard(status=S.PENDING, not_cancelled=True),
            )
        except Conflict as err:
            raise Cancelled(f"job {job_id} was cancelled") from err
    else:
        try:
            deps.jobs.transition(job_id, [status], S.PENDING, {"placement_token": token},
                                 guard=Guard(not_cancelled=True))
        except InvalidTransition:
            jobio.ensure_not_cancelled(_job(deps, job_id))
            raise
    _announce_pending(deps, job_id)
    return {"job_id": job_id, "status": S.PENDING.value}


def _announce_pending(deps: Deps, job_id: str) -> None:
    """Trigger a scheduler pass now (``JobPending`` on the bus): the job is parked and visible on gsi3."""
    _announce(deps, "JobPending", {"job_id": job_id})


def _announce(deps: Deps, detail_type: str, detail: dict[str, Any]) -> None:
    """Put a scheduler trigger (``JobPending``, ``CapacityFreed``) on the bus. Best effort: the pass also
    runs on a timer, so a failed put is logged, not raised."""
    if deps.events is None:
        return
    try:
        deps.events.put(detail_type, detail)
    except TransientError as err:
        _log.warning("%s event for %s: %s", detail_type, detail.get("job_id"), err)


# ----------------------------------------------------------------------------- PrepareRun


def envelope_for(deps: Deps, job: JobRecord, placement: Placement, stage: str) -> Envelope:
    s = deps.settings
    job_id = job.job_id
    epoch = placement.epoch
    return Envelope(
        job_id=job_id,
        attempt=placement.attempt or epoch,
        epoch=epoch,
        stage=stage,
        spec=job.spec,
        s3=S3Locations(
            bucket_outputs=s.outputs_bucket,
            bucket_checkpoints=s.checkpoints_bucket,
            bucket_logs=s.logs_bucket,
            output_prefix=f"jobs/{job_id}/",
            checkpoint_prefix=f"jobs/{job_id}/",
            log_prefix=f"jobs/{job_id}/attempt-{epoch:04d}/",
            inputs=list(job.spec.data.inputs),
            output_max_bytes=s.output_max_bytes,
            output_max_files=s.output_max_files,
        ),
        placement=placement,
        tables={"jobs": s.jobs_table, "control": s.control_table, "ledger": s.ledger_table},
        heartbeat_seconds=s.heartbeat_seconds,
        traceparent=job.traceparent if tracing.valid(job.traceparent) else None,
        model_hash=job.model_hash,
    )


def runtime_command(env: Envelope) -> list[str]:
    """The Batch container's command: the runtime with the *pointer* envelope (no spec, no inputs; the
    runtime reads them from the job item), so Batch job descriptions hold no prompt or env."""
    return ["python", "-m", "gpufleet.runtime", "--envelope-json", env.pointer().model_dump_json(exclude_none=True)]


def prepare_run(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """Check the placement's epoch is current and the job not cancelled; build the Run input:
    ``{"target", "workload", "queue_url", "job_queue", "job_definition", "batch_job_name", "command", "envelope",
    "resource_requirements", "attempt_duration_seconds"}`` (``workload``: ``video`` or ``container``, which the
    workflow's ``CloudWorkload`` choice reads: a cloud container job runs as RunCloudContainer), and ``node_overrides`` for a cloud gang (a placement
    with ``members`` on a cloud pool: :func:`gpufleet.batchdef.node_overrides`, RunCloudGang's multi-node parallel
    job, one node per member) (``resource_requirements``/``attempt_duration_seconds``: RunCloud's Batch GPU/vCPU/memory
    overrides, from the spec, and its ``Timeout.attemptDurationSeconds``: the spec's ``max_run_seconds`` with a
    margin, :func:`gpufleet.batchdef.attempt_duration_seconds`, so Batch stops a hung attempt too).
    The state keeps ids only: ``envelope`` and ``command`` carry the pointer envelope
    (:meth:`gpufleet.envelope.Envelope.pointer`), never the spec (prompts, container env)."""
    placement = _state_placement(state)
    job = _job(deps, state["job_id"])
    jobio.ensure_not_cancelled(job)
    epoch = placement.epoch
    if job.current_epoch != epoch:
        raise StaleEpoch(f"placement epoch {epoch} is not current", current_epoch=job.current_epoch)
    env = envelope_for(deps, job, placement, "generate" if _is_video(job) else "container")
    r = job.spec.resources
    command = runtime_command(env)
    gang = placement.target == "cloud" and len(placement.members or ()) > 1
    return {
        "target": placement.target,
        "workload": "video" if _is_video(job) else "container",
        "queue_url": placement.queue_url,
        "job_queue": placement.job_queue,
        "job_definition": placement.job_definition,
        "batch_job_name": f"{job.job_id}-e{epoch}",
        "command": command,
        "envelope": env.pointer().model_dump(mode="json", exclude_none=True),
        "resource_requirements": resource_requirements(r.gpus, r.cpu, r.memory_gb),
        # a cloud gang: one Batch multi-node parallel job, a node per member (RunCloudGang)
        **({"node_overrides": node_overrides(len(placement.members or ()), command,
                                             resource_requirements(r.gpus, r.cpu, r.memory_gb))} if gang else {}),
        "attempt_duration_seconds": attempt_duration_seconds(job.spec.max_run_seconds,
                                                             deps.settings.run_timeout_seconds),
    }


def _state_placement(state: dict[str, Any]) -> Placement:
    """The placement the state carries (the Run states always have one)."""
    placement = Placement.from_state(state)
    if placement is None or "epoch" not in state["placement"]:
        raise KeyError("epoch")
    return placement


def _is_video(job: JobRecord) -> bool:
    return isinstance(job.spec.workload, VideoGenerate)


def _finalize_pixels(job: JobRecord) -> int:
    """A video's finalize work (frames × delivered pixels, :func:`gpufleet.finalize_route.finalize_pixels`), which
    the workflow's ``FinalizeRoute`` compares with the finalize Lambda's bound; 0 for a container job."""
    w = job.spec.workload
    return finalize_pixels(w.frames, w.width, w.height) if isinstance(w, VideoGenerate) else 0


# ----------------------------------------------------------------------------- CompleteRun


def _batch_wall_seconds(result: dict[str, Any]) -> float | None:
    started = result.get("StartedAt", result.get("startedAt"))
    stopped = result.get("StoppedAt", result.get("stoppedAt"))
    if started and stopped and stopped >= started:
        return (float(stopped) - float(started)) / 1000.0
    return None


def resume_finalize(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """``ResumeFinalize`` (a re-finalize run, :mod:`gpufleet.lifecycle.recovery`): the job is FINALIZING
    again at the epoch the operator re-finalized; rebuild CompleteRun's result from the persisted
    generation (``last_run`` of that epoch, the job's placement) without touching the run. A job that
    moved on (another epoch, cancelled) raises :class:`StaleEpoch` / :class:`Cancelled`."""
    job = _job(deps, state["job_id"])
    jobio.ensure_not_cancelled(job)
    epoch = int((job.recovery or {}).get("epoch", -1))
    placement = job.placement
    if job.status is not S.FINALIZING or placement is None or job.current_epoch != epoch:
        raise StaleEpoch(f"job {job.job_id} is {job.status.value} at epoch {job.current_epoch}; nothing to resume",
                         current_epoch=job.current_epoch)
    last_run = dict(job.last_run or {})
    gpu_secs = float(last_run.get("gpu_seconds") or 0.0)
    video = _is_video(job)
    # the finalize phase (Publish measures it from finalizing_at) is this re-finalize, not the wait before it
    deps.jobs.fenced_update(job.job_id, epoch, {"last_run": {**last_run, "finalizing_at": deps.clock.now()}})
    deps.jobs.append_event(job.job_id, "refinalize_started", {"epoch": epoch})
    return {
        "epoch": epoch,
        "gpu_seconds": gpu_secs,
        "workload": "video" if video else "container",
        "batch_job_name": f"{job.job_id}-e{epoch}-finalize",
        "finalize_command": runtime_command(envelope_for(deps, job, placement, "finalize")) if video else [],
        "finalize_pixels": _finalize_pixels(job),
    }


def complete_run(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """The Run state succeeded: record the attempt's GPU-seconds, move the job to FINALIZING (fenced on
    the attempt's epoch; the status event's detail carries the attempt's phase timings,
    :func:`gpufleet.phases.summary`, also emitted as ``PhaseSeconds``), give the attempt's GPUs and quota back
    (``CapacityFreed``: finalize needs no GPU) and build the finalize stage's command. A worker result naming another epoch
    raises :class:`StaleEpoch`. A re-finalize run (``resume`` in the state) is :func:`resume_finalize`."""
    if state.get("resume") == "finalize":
        return resume_finalize(deps, state)
    placement = _state_placement(state)
    epoch = placement.epoch
    result = state.get("result") or {}
    job = _job(deps, state["job_id"])
    jobio.ensure_not_cancelled(job)
    if "epoch" in result and int(result["epoch"]) != epoch:
        raise StaleEpoch(f"run result is for epoch {result['epoch']}, attempt is {epoch}")
    if result.get("gpu_seconds") is not None:
        gpu_secs = float(result["gpu_seconds"])
    else:
        wall = _batch_wall_seconds(result) or 0.0
        # the spec's per-node share (placement.gpu_milli is per GPU): gpus: 4 bills 4 GPUs, not 1
        gpu_secs = gpu_seconds(wall, job.spec.resources.gpu_milli, job.spec.resources.nodes)
    phases = summary(attempt_marks(deps.jobs.get_attempt(job.job_id, epoch)))
    extra: dict[str, Any] = {"last_run": {"epoch": epoch, "gpu_seconds": gpu_secs, "phases": phases,
                                          "finalizing_at": deps.clock.now()}}
    if result.get("generated") and not job.generated:
        extra["generated"] = result["generated"]
    # the run is over: its GPUs and quota go back now, not after finalize (a CPU stage elsewhere), so the next job
    # starts on them while this one is finalized; first, so a retried step after a crash between the writes finds
    # the release done (idempotent) and the transition still to do
    _release(deps, job.job_id, epoch)
    if job.status is S.SCHEDULED:
        deps.jobs.transition(job.job_id, [S.SCHEDULED], S.RUNNING, epoch=epoch)
    deps.jobs.transition(job.job_id, [S.RUNNING], S.FINALIZING, extra,
                         detail={"gpu_seconds": gpu_secs, "phases": phases}, epoch=epoch)
    pool = placement.pool or "unknown"
    deps.metrics.put(M.GPU_SECONDS, gpu_secs, {M.POOL: pool})
    for phase, seconds in phases["durations"].items():
        deps.metrics.put(M.PHASE_SECONDS, seconds, {M.POOL: pool, M.PHASE: phase})
    if phases.get("model_cache"):
        deps.metrics.put(M.MODEL_LOADS, 1, {M.POOL: pool, M.MODEL_CACHE: phases["model_cache"]})
    video = _is_video(job)
    return {
        "epoch": epoch,
        "gpu_seconds": gpu_secs,
        "workload": "video" if video else "container",
        "batch_job_name": f"{job.job_id}-e{epoch}-finalize",
        "finalize_command": runtime_command(envelope_for(deps, job, placement, "finalize")) if video else [],
        "finalize_pixels": _finalize_pixels(job),
    }


# ----------------------------------------------------------------------------- CollectOutputs


def collect_outputs(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """A container job's run succeeded: count the files its worker published under the attempt's
    prefix (``generated.key`` = ``jobs/<id>/output/e<epoch:04d>/``), listed in the outputs bucket
    (the worker's own report is not trusted for the cap), check them against the per-job cap and
    record ``output`` = ``{"kind": "files", "prefix", "files", "bytes"}`` fenced on the attempt's epoch.
    Over the cap → :class:`~gpufleet.errors.OutputTooLarge` (the workflow routes it to
    ClassifyFailure: a USER failure). Returns ``{"files", "bytes"}``."""
    epoch = int(_value(state, "completed").get("epoch") or _state_placement(state).epoch)
    job = _job(deps, state["job_id"])
    jobio.ensure_not_cancelled(job)
    if job.current_epoch != epoch:
        raise StaleEpoch(f"epoch {epoch} of {job.job_id} is stale", current_epoch=job.current_epoch)
    prefix = f"jobs/{job.job_id}/output/e{epoch:04d}/"
    generated = job.generated or {}
    if generated.get("key") != prefix:
        raise Conflict(f"job {job.job_id} has no published output for epoch {epoch}")
    if deps.outputs is None:
        raise Conflict("no output store configured")
    s = deps.settings
    listed = deps.outputs.list(prefix, s.output_max_files)
    total = sum(size for _, size in listed)
    if len(listed) > s.output_max_files or total > s.output_max_bytes:
        more = "more than " if len(listed) > s.output_max_files else ""
        raise OutputTooLarge(
            f"the job's output ({more}{len(listed)} files, {total} bytes) exceeds the per-job cap of "
            f"{s.output_max_files} files and {s.output_max_bytes} bytes"
        )
    output = {"kind": "files", "prefix": prefix, "files": len(listed), "bytes": total}
    deps.jobs.fenced_update(job.job_id, epoch, {"output": output})
    return {"files": len(listed), "bytes": total}


# ----------------------------------------------------------------------------- ClassifyFailure


def _current_placement(job: JobRecord, state: dict[str, Any]) -> Placement | None:
    """The state's placement if it belongs to the job's current attempt, else None (stale or absent)."""
    raw = state.get("placement")
    if not raw or "epoch" not in raw:
        return None
    placement = Placement.parse(raw)
    return placement if placement.epoch == job.current_epoch else None


def _lost_attempt(deps: Deps, job: JobRecord, placement: Placement | None) -> Placement | None:
    """The placement of the attempt whose worker was lost: the state's, else (Step Functions reported the
    timeout, so no worker named it) the attempt item of the job's current epoch while that attempt is
    live (SCHEDULED/RUNNING). None when there is none (e.g. the wait for a placement timed out)."""
    if placement:
        return placement
    epoch = job.current_epoch
    if epoch <= 0 or job.status not in RUNNABLE:
        return None
    return Placement.parse((deps.jobs.get_attempt(job.job_id, epoch) or {}).get("placement"))


def classify_failure(deps: Deps, state: dict[str, Any]) -> dict[str, Any]:
    """Classify the caught error, update retry accounting and decide.

    retry → the failed attempt is fenced off (a new epoch is issued, so a late worker's writes are
    rejected at once), its quota released; the job goes back to PENDING in AwaitPlacement after
    ``wait_seconds``. A lost worker (heartbeat timeout) is named by the state's placement or, when
    the state has none, by the attempt item of the current epoch; all of that attempt's on-prem
    nodes join ``failed_nodes`` (and its first node ``crashed_workers``), written with the rest
    of the accounting under the same epoch condition.
    fail / quarantine / cancelled → terminal status with ``final`` for Bill.
    Returns ``{"action", "wait_seconds", "class", "reason", "outcome", "epoch"}``.
    """
    job = _job(deps, state["job_id"])
    status = job.status
    placement = _current_placement(job, state)
    crash = (deps.jobs.get_attempt(job.job_id, placement.epoch) or {}).get("crash") if placement else None
    failure = classify(state.get("error"), placement, cancel_requested=job.cancel_requested, crash=crash)
    lost_nodes: frozenset[str] = frozenset()
    if failure.lost:
        lost_on = _lost_attempt(deps, job, placement)
        lost_nodes = attempt_nodes(lost_on)
        if failure.worker is None and lost_on:
            failure = replace(failure, worker=lost_on.node or lost_on.pool or None)
    acc = Accounting(job.system_failures, job.preemptions, job.crashed_workers, job.failed_nodes,
                     Accounting.parse_crashes(job.crashes))
    started = status in (S.RUNNING, S.FINALIZING)
    decision = decide(acc, failure, deps.settings.retry, deps.rand(), started=started, nodes=lost_nodes)
    if decision.outcome is Outcome.USER_ERROR and failure.cls is not FailureClass.USER:
        failure = replace(failure, cls=FailureClass.USER, reason=decision.reason)  # a deterministic crash
    epoch = job.current_epoch
    attempt_epoch = placement.epoch if placement else 0
    wall = failure.wall_seconds or 0.0
    if decision.outcome in (Outcome.CANCELLED_RUNNING, Outcome.TIMED_OUT) and not wall and job.running_since:
        wall = max(0.0, deps.clock.now() - job.running_since)
    if decision.outcome is Outcome.TIMED_OUT and job.spec.max_run_seconds:
        wall = min(wall, float(job.spec.max_run_seconds))  # never charged beyond the tenant's limit
    # every GPU the attempt booked, on every member (placement.gpu_milli is per GPU: gpus 2 × nodes 2 is 4 GPUs)
    r = job.spec.resources
    gpu_secs = gpu_seconds(wall, r.gpu_milli, r.nodes) if placement else 0.0
    if placement and gpu_secs > 0:  # the failed run's own GPU time (a run that completed was counted then)
        deps.metrics.put(M.GPU_SECONDS, gpu_secs, {M.POOL: placement.pool or "unknown"})
    deps.metrics.put(M.ATTEMPT_FAILURES, 1, {M.FAILURE_CLASS: failure.cls.value})
    last_run = job.last_run or {}
    if not wall and placement and int(last_run.get("epoch", -1)) == placement.epoch:
        gpu_secs = float(last_run.get("gpu_seconds") or 0.0)  # the run ended; a later step failed (e.g. outputs)
    rule = deps.settings.billing.rule(decision.outcome)
    accounting = {
        "system_failures": decision.accounting.system_failures,
        "preemptions": decision.accounting.preemptions,
        "last_failure": {"epoch": attempt_epoch, "class": failure.cls.value, "reason": failure.reason[:500],
                         "worker": failure.worker, "at": iso(deps.clock.now())},
    }
    if decision.accounting.crashed_workers:
        accounting["crashed_workers"] = set(decision.accounting.crashed_workers)
    if decision.accounting.failed_nodes:
        accounting["failed_nodes"] = set(decision.accounting.failed_nodes)
    if decision.accounting.crashes:
        accounting["crashes"] = decision.accounting.crash_items()
    detail = {
        "epoch": attempt_epoch, "class": failure.cls.value, "reason": failure.reason[:500],
        "action": decision.action, "wait_seconds": decision.wait_seconds,
        "waiver": rule.waiver if rule.charge == "none" else None,
    }
    if failure.fingerprint:
        detail["crash_fingerprint"] = failure.fingerprint
    if decision.action == "retry":
        if placement:
            # Fence the failed attempt off now: a worker declared dead must not land a write later.
            try:
                epoch = deps.jobs.issue_epoch(job.job_id, epoch, accounting)
            except Conflict:
                job = _job(deps, job.job_id)
                epoch = job.current_epoch
                deps.jobs.fenced_update(job.job_id, epoch, accounting)
            _release(deps, job.job_id, attempt_epoch)
        else:
            deps.jobs.fenced_update(job.job_id, epoch, accounting)
        deps.jobs.append_event(job.job_id, "attempt_failed", detail)
    else:
        target = decision.terminal_status
        final = _final(decision.outcome, attempt_epoch, gpu_secs, placement, decision.reason[:500])
        deps.jobs.transition(job.job_id, [status], target, {**accounting, "final": final},
                             detail=detail, remove=("placement_token",), epoch=epoch)
        _release(deps, job.job_id, attempt_epoch or _unseen_attempt(job, placement))
        _ended(deps, job.job_id)
    return {
        "action": decision.action,
        "wait_seconds": decision.wait_seconds,
        "class": failure.cls.value,
        "reason": failure.reason[:500],
        "outcome": decision.outcome.value,
        "epoch": epoch,
    }


# ----------------------------------------------------------------------------- MarkTerminal


def mark_terminal(deps: Deps, state: dict[str, Any], status: str, stage: str = "finalize") -> dict[str, Any]:
    """Record REJECTED (prompt blocked; never placed, never charged) or FAILED (``stage`` "finalize":
    finalize or publish exhausted their retries; "workflow": a task of the workflow itself failed for
    good) — a system failure, not charged. Returns ``{"status", "outcome"}``."""
    target = S(status)
    inner = state.get("state") or state
    job = _job(deps, inner["job_id"])
    if target is S.REJECTED:
        reason = _value(inner, "prompt").get("reason") or "prompt blocked by the safety filter"
        final = _final(Outcome.REJECTED, 0, 0.0, None, str(reason))
        deps.jobs.transition(job.job_id, [S.QUEUED], S.REJECTED, {"final": final}, detail={"reason": reason})
        _ended(deps, job.job_id)
        return {"status": target.value, "outcome": Outcome.REJECTED.value}
    if target is S.FAILED:
        epoch = job.current_epoch
        placement = Placement.from_state(inner)
        if placement is not None and placement.epoch != epoch:
            placement = None
        err = inner.get("error") or {}
        reason = f"{stage} failed: {err.get('Error', 'error')}"
        final = _final(Outcome.SYSTEM_FAILURE, epoch, float(_value(inner, "completed").get("gpu_seconds") or 0.0),
                       placement, reason)
        deps.jobs.transition(job.job_id, [job.status], S.FAILED, {"final": final},
                             detail={"reason": reason}, epoch=epoch)
        if placement:  # a workflow that failed for good is rare: the timer's pass reuses its GPUs
            _release(deps, job.job_id, epoch, announce=False)
        _ended(deps, job.job_id)
        deps.metrics.put(M.FINALIZE_FAILED if stage == "finalize" else M.WORKFLOW_FAILED, 1)
        return {"status": target.value, "outcome": Outcome.SYSTEM_FAILURE.value}
    raise InvalidTransition(f"mark_terminal does not record {target.value}")


# ----------------------------------------------------------------------------- Publish


def publish(deps: Deps, state: dict[str, Any], epoch: int | None = None) -> dict[str, Any]:
    """Fenced publish: FINALIZING → SUCCEEDED with the finalize stage's ``output``, or → BLOCKED when
    the finalize stage recorded ``moderation.blocked`` (the output is then never exposed). The time since
    CompleteRun is the attempt's ``finalize`` phase: added to ``last_run.phases.durations``, to the status
    event's ``detail.phases`` and emitted as ``PhaseSeconds``. The write
    lands only if ``epoch`` (the attempt's) is the job's current epoch: a fenced-off worker calling
    this gets :class:`StaleEpoch`. Returns ``{"status", "outcome"}``."""
    placement = Placement.from_state(state)
    if epoch is None:
        epoch = _value(state, "completed").get("epoch", placement.epoch if placement else None)
    epoch = int(epoch)
    job = _job(deps, state["job_id"])
    if job.current_epoch != epoch:
        raise StaleEpoch(f"epoch {epoch} of {job.job_id} is stale", current_epoch=job.current_epoch)
    jobio.ensure_not_cancelled(job)
    placement = job.placement or placement
    last_run = dict(job.last_run or {})
    gpu_secs = float(last_run.get("gpu_seconds") or 0.0)
    # the finalize phase: CompleteRun (FINALIZING) to now (finalize stage or output collection, then publish)
    finalize_s = None
    if last_run.get("finalizing_at") is not None and int(last_run.get("epoch", -1)) == epoch:
        finalize_s = round(max(0.0, deps.clock.now() - float(last_run["finalizing_at"])), 3)
        phases = dict(last_run.get("phases") or {})
        phases["durations"] = {**(phases.get("durations") or {}), FINALIZE_PHASE: finalize_s}
        last_run["phases"] = phases
    timing = {"last_run": last_run} if finalize_s is not None else {}
    detail = {"phases": {FINALIZE_PHASE: finalize_s}} if finalize_s is not None else {}
    moderation = job.moderation or {}
    if moderation.get("blocked"):
        final = _final(Outcome.BLOCKED, epoch, gpu_secs, placement,
                       f"output blocked by moderation: {moderation.get('reason', '')}")
        deps.jobs.transition(job.job_id, [S.FINALIZING], S.BLOCKED, {"final": final, **timing},
                             detail={"reason": final["reason"], **detail}, remove=("output",), epoch=epoch)
        outcome = Outcome.BLOCKED
    else:
        if not job.output:
            raise Conflict(f"job {job.job_id} has no output to publish")
        _index_provenance(deps, job)
        final = _final(Outcome.SUCCEEDED, epoch, gpu_secs, placement, None)
        deps.jobs.transition(job.job_id, [S.FINALIZING], S.SUCCEEDED,
                             {"final": final, "published_at": iso(deps.clock.now()), **timing},
                             detail=detail or None, epoch=epoch)
        outcome = Outcome.SUCCEEDED
    if finalize_s is not None:
        pool = (placement.pool if placement else None) or "unknown"
        deps.metrics.put(M.PHASE_SECONDS, finalize_s, {M.POOL: pool, M.PHASE: FINALIZE_PHASE})
    _ended(deps, job.job_id)  # (the attempt's GPUs went back at CompleteRun)
    status = S.SUCCEEDED if outcome is Outcome.SUCCEEDED else S.BLOCKED
    return {"status": status.value, "outcome": outcome.value}


def _index_provenance(deps: Deps, job: JobRecord) -> None:
    """Index a video's manifest by its watermark payload before the output becomes visible (a retry
    re-puts the same entry; the API shows entries of SUCCEEDED jobs only)."""
    out = job.output or {}
    if deps.provenance is None or not out.get("watermark_payload") or not out.get("manifest_key"):
        return  # a container job's files, or a video finalized before the index existed
    deps.provenance.record(ProvenanceEntry(
        payload=out["watermark_payload"], job_id=job.job_id, key_id=out.get("watermark_key_id"),
        video_key=out["video_key"], manifest_key=out["manifest_key"], video_sha256=out.get("video_sha256"),
        published_at=iso(deps.clock.now())))


# ----------------------------------------------------------------------------- Bill


def bill(deps: Deps, job_id: str, *, epoch: int | None = None) -> dict[str, Any]:
    """Charge the job's final attempt by the billing policy: one ledger entry per charged (job, epoch),
    written once and fenced on ``epoch`` (defaults to the attempt in ``final``); a waiver reason is
    recorded on the job otherwise. Returns the job's ``billing``."""
    job = _job(deps, job_id)
    final = job.final
    if not final:
        raise InvalidTransition(f"job {job_id} has no final outcome to bill", current_status=job.status.value)
    outcome = Outcome(final["outcome"])
    attempt_epoch = int(final.get("epoch") or 0)
    if epoch is not None and epoch != job.current_epoch:
        raise StaleEpoch(f"epoch {epoch} of {job_id} is stale; billing refused", current_epoch=job.current_epoch)
    charge = charge_for(outcome, float(final.get("gpu_seconds") or 0.0),
                        float(final.get("price_per_gpu_hour") or 0.0), deps.settings.billing)
    at = iso(deps.clock.now())
    # what a ledger entry names (cost reports group by owner, label and pool)
    owner = {**job.model_dump(include={"job_id", "tenant", "owner_path"}), "labels": dict(job.spec.labels)}
    price = float(final.get("price_per_gpu_hour") or 0.0)
    if charge.charged and charge.amount_usd > 0:
        written = deps.ledger.record(owner, epoch if epoch is not None else attempt_epoch, charge,
                                     pool=final.get("pool"), price=price, at=at)
    else:
        if charge.charged:  # a chargeable outcome that consumed nothing: no entry, say why
            charge = Charge(False, charge.gpu_seconds, charge.amount_usd, "no GPU time consumed", outcome)
        deps.ledger.record_waiver(job_id, job.current_epoch, charge, at, job=owner, pool=final.get("pool"),
                                  price=price)
        written = False
    deps.jobs.append_event(job_id, "billed", {**charge.as_item(), "ledger_entry_written": written})
    deps.metrics.put(M.JOBS_ENDED, 1, {M.OUTCOME: outcome.value})
    return {**charge.as_item(), "ledger_entry_written": written}


# ----------------------------------------------------------------------------- Notify


def notify(deps: Deps, job_id: str) -> dict[str, Any]:
    """Queue the ``completed`` webhook event for the job's own webhook (if it subscribes) and its tenant's
    matching endpoints. Returns ``{"msg_id"}`` (the first queued, None if none) and ``{"queued"}`` (how many)."""
    job = _job(deps, job_id)
    queued: list[str] = []
    if deps.settings.webhook_queue_url and deps.sqs is not None:
        queued = delivery.queue_event(deps.sqs, deps.settings.webhook_queue_url, job, "completed", clock=deps.clock,
                                      endpoints=deps.webhook_endpoints)
    return {"msg_id": queued[0] if queued else None, "queued": len(queued), "status": job.status.value}
