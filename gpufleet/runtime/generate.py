"""The ``generate`` stage: resumable text-to-video inference with a diffusers ``WanPipeline``.

Contract (see docs/runtime.md):
1. Idempotent: if the job already has a valid ``generated`` pointer (object
   present, hash matching) the stage succeeds without running inference.
2. Inputs named in ``spec.data.inputs`` are staged first; bytes/seconds are
   recorded on the attempt item (fenced). A development runtime's test fault
   ``fault_staging_delay_s`` lengthens staging (:func:`stage_inputs`). The job's input folder
   (``<cache>/jobs/<job id>/``) is removed when the stage ends, whatever the outcome; with
   ``cache_max_bytes`` (a cloud GPU instance's host cache) the run evicts the cache once its model is
   resolved (:func:`evict_host_cache`).
3. Resume from the job's ``checkpoint`` pointer (falling back to older valid
   checkpoints), or start at step 0. A checkpoint from a different request or
   model (fingerprint mismatch) is ignored.
4. Between steps the loop checks :class:`RunControl`: preempted (SIGTERM, spot
   notice) → checkpoint now, synchronously, and exit PREEMPTED — unless the job, read once, was cancelled (a
   SIGTERM may be Batch's TerminateJob for a cancel: :func:`gpufleet.runtime.context.refined_stop`), then no
   checkpoint and CANCELLED; cancelled → CANCELLED; fenced → FENCED. The step in flight when a signal arrives is
   completed and included in that checkpoint. A development runtime's test
   fault ``fault_step_delay_s`` lengthens each step.
5. Once the model is loaded and the start state is ready, the job moves
   SCHEDULED→RUNNING (:meth:`JobItem.mark_running`, fenced); the write runs
   while the first step computes and is settled before any other write of the
   attempt (:mod:`gpufleet.runtime.overlap`), so a fenced attempt stops after
   at most one step.
6. Periodic checkpoints follow :class:`CheckpointPolicy` and are written
   asynchronously unless ``settings.async_checkpoints`` is off: by a writer
   thread, or with ``settings.checkpoint_writer == "process"`` by a writer
   process (:mod:`gpufleet.runtime.ckptproc`, clients from the environment).
   Uploads are paced by :class:`UploadPacer` so they cost the loop at most
   ``settings.checkpoint_overhead_budget`` of its time (the recovery point
   lags instead), and at least every ``checkpoint_max_lag_seconds``. A due
   checkpoint is taken only once the writer ``accepts()`` it (else it stays due). The time the loop
   waits on checkpoints (snapshot and hand-over, a synchronous upload, the final drain) is timed by
   :class:`LoopCheckpoints` and recorded as the ``checkpoint_stall`` phase.
7. The decoded frames are persisted to ``<output_prefix>generated/e<epoch:04d>.npz``
   and only then the fenced ``generated`` pointer is set: a run counts as
   generated once its output is durable.
8. Phase timings (:mod:`gpufleet.phases`): ``started``, ``inputs_staged``, ``model_loaded`` (model cache
   hit or miss, bytes fetched; absent when a warm worker had the model resident: ``model_cache`` is then
   ``resident`` and there is no model-load phase, :mod:`gpufleet.runtime.resident`), ``first_step``,
   ``generation_done``, the steps run, the mean step time, ``checkpoint_stall`` and the GPU-busy share of
   the loop (``gpu_busy``, when :mod:`gpufleet.runtime.gpuutil` can measure it) are recorded as ``phases`` on the attempt item (fenced) once the output is durable. Best
   effort: a record that cannot be written is logged, never failing the run.
9. In a batch (``ctx.batch``, a :class:`gpufleet.runtime.batchloop.BatchMember`: several jobs' stages as
   threads of one warm worker) the loop's state is built and stepped through the batch, and the member
   leaves it as soon as its loop ends, whatever the reason (done, cancelled, fenced, preempted, an error):
   everything else above is the member's own. Its phases add ``batch_members`` (the widest round it was
   in) and ``batch_gpu_s`` (its share of the rounds' time).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from typing import Any

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.errors import NotFound, ValidationFailed
from gpufleet.models.loader import ModelLoader, load_pipeline
from gpufleet.models.tiny_wan import TINY_MODEL_NAME
from gpufleet.phases import PhaseRecorder
from gpufleet.runtime import denoise, gpuutil, resident
from gpufleet.runtime.checkpoint import (
    AsyncCheckpointer,
    CheckpointPolicy,
    CheckpointStore,
    LoopCheckpoints,
    SyncCheckpointer,
)
from gpufleet.runtime.ckptpace import UploadPacer
from gpufleet.runtime.ckptproc import CheckpointTarget, ProcessCheckpointer
from gpufleet.runtime.context import StageContext, refined_stop
from gpufleet.runtime.device import torch_device
from gpufleet.runtime.generated import pack_output, unpack_output  # noqa: F401 - unpack_output re-exported
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.runtime.overlap import Overlapped
from gpufleet.runtime.staging import Stager
from gpufleet.spec import JobSpec, VideoGenerate
from gpufleet.store.objectstore import sha256_hex

FPS = 8


def generation_request(w: VideoGenerate, tiny_side: int) -> denoise.GenerationRequest:
    """The request the model runs. ``wan-tiny`` generates at most ``tiny_side`` px a side (finalize upscales)."""
    width, height = w.width, w.height
    if w.model == TINY_MODEL_NAME and max(width, height) > tiny_side:
        scale = tiny_side / max(width, height)
        width = max(16, int(width * scale) // 16 * 16)
        height = max(16, int(height * scale) // 16 * 16)
    return denoise.GenerationRequest(
        prompt=w.prompt, negative_prompt=w.negative_prompt, frames=w.frames, width=width, height=height,
        steps=w.steps, seed=w.seed, guidance=w.guidance,
        max_sequence_length=16 if w.model == TINY_MODEL_NAME else 512,
    )


def _workload(js: JobSpec) -> tuple[JobSpec, VideoGenerate]:
    if not isinstance(js.workload, VideoGenerate):
        raise ValidationFailed("the generate stage needs a video.generate workload")
    return js, js.workload


def existing_output(ctx: StageContext, item: dict[str, Any]) -> dict[str, Any] | None:
    ref = item.get("generated")
    if not ref:
        return None
    try:
        data = ctx.objects.get_bytes(ctx.envelope.s3.bucket_outputs, ref["key"])
    except NotFound:
        return None
    return ref if sha256_hex(data) == ref.get("sha256") else None


def run(ctx: StageContext) -> ExitCode:
    phases = PhaseRecorder(time.time)
    phases.mark("started")
    env = ctx.envelope
    js, w = _workload(env.spec)
    item = ctx.job.check_current()
    if item.get("cancel_requested"):
        return ExitCode.CANCELLED
    done = existing_output(ctx, item)
    if done:
        ctx.log.info("inference output already persisted at %s; nothing to do", done["key"])
        ctx.result["generated"] = done
        return ExitCode.SUCCEEDED

    store = CheckpointStore(ctx.objects, env.s3.bucket_checkpoints, env.s3.checkpoint_prefix, env.epoch,
                            lambda ref: ctx.job.set_checkpoint(ref.key, ref.sha256, ref.step))
    # Started now so that a writer process's start-up (interpreter, boto3, warm-up: ~0.7 s of CPU) overlaps
    # staging and the model load rather than the first denoising steps.
    writer = _writer(ctx, store)
    try:
        return _generate(ctx, js, w, item, store, writer, phases)
    finally:
        writer.close()
        # the staged inputs' hard links: left behind they would keep evicted blobs on disk, one folder per job
        shutil.rmtree(ctx.settings.cache_path / "jobs" / env.job_id, ignore_errors=True)


def _writer(ctx: StageContext, store: CheckpointStore):
    env = ctx.envelope
    pacer = UploadPacer(ctx.settings.checkpoint_overhead_budget, ctx.settings.checkpoint_max_lag_seconds)
    if not ctx.settings.async_checkpoints:
        return SyncCheckpointer(store, denoise.serialize)
    if ctx.settings.checkpoint_writer == "process":
        return ProcessCheckpointer(CheckpointTarget(env.s3.bucket_checkpoints, env.s3.checkpoint_prefix, env.epoch,
                                                    ctx.job.table, env.job_id, ctx.objects.node_id,
                                                    ctx.settings.node_api_url or ""),
                                   denoise.serialize, pacer=pacer)
    return AsyncCheckpointer(store, denoise.serialize, pacer=pacer)


def _record_phases(ctx: StageContext, phases: PhaseRecorder) -> None:
    """Write the attempt's phase timings (contract 8); never fails the run."""
    try:
        ctx.job.record_attempt({"phases": phases.as_item()})
    except Exception as err:  # noqa: BLE001 - timings are diagnostics: the run's result stands
        ctx.log.warning("could not record the attempt's phase timings: %s", err)


def _generate(ctx: StageContext, js: JobSpec, w: VideoGenerate, item: dict[str, Any], store: CheckpointStore,
              writer, phases: PhaseRecorder) -> ExitCode:
    env = ctx.envelope
    cache = ctx.settings.cache_path
    stage_inputs(ctx, js, phases)

    if ctx.settings.torch_threads:
        import torch

        torch.set_num_threads(ctx.settings.torch_threads)
    loader = ModelLoader(cache, ctx.objects, ctx.settings.model_root, ctx.settings.model_s3_root,
                         reverify_s=ctx.settings.cache_reverify_s)
    device = torch_device(ctx.settings.device)
    warm = resident.RESIDENT
    held = (lambda name, digest: warm.holds(resident.ModelKey(name, digest, device))) if warm is not None else None
    model = loader.resolve(w.model, held, expect=ctx.envelope.model_hash)
    evict_host_cache(ctx, keep=model.content_hash)
    pipe = _pipeline(model, device, phases)
    ctx.log.info("generating on %s", device)
    req = generation_request(w, ctx.settings.tiny_generate_side)
    fingerprint = req.fingerprint(model.content_hash)

    def _valid(data: bytes) -> dict[str, Any]:
        snap = denoise.deserialize(data)
        if snap.get("fingerprint") != fingerprint:
            raise ValueError("checkpoint belongs to a different request or model")
        return snap

    loaded = store.load(item.get("checkpoint"), _valid)
    if loaded:
        ref, snap = loaded
        state = denoise.restore(pipe, snap) if ctx.batch is None else ctx.batch.restore(pipe, req, snap)
        ctx.log.info("resumed from %s at step %d", ref.key, state.next_step)
        ctx.reporter.event("resumed", step=state.next_step, key=ref.key)
    else:
        state = denoise.start(pipe, req, fingerprint) if ctx.batch is None else ctx.batch.start(pipe, req, fingerprint)
        ctx.log.info("starting at step 0 (%d steps, %dx%d, %d frames)", req.steps, req.width, req.height, req.frames)

    # SCHEDULED→RUNNING is written while the first step runs, and settled before any other write (overlap.py)
    running = Overlapped(ctx.job.mark_running, name="mark-running")
    if isinstance(writer, ProcessCheckpointer) and not writer.ready.wait(60):
        ctx.log.warning("checkpoint writer process not ready after 60 s; starting the loop anyway")
    ckpts = LoopCheckpoints(writer, CheckpointPolicy(ctx.settings.checkpoint_every_steps,
                                                     ctx.settings.checkpoint_every_seconds), state.next_step)
    steps_run, loop_end, busy = 0, None, None
    step_delay = ctx.settings.fault_step_delay_s if ctx.settings.dev_mode else 0.0
    if step_delay:
        ctx.log.warning("test fault: each step delayed by %.3fs (GPUFLEET_FAULT_STEP_DELAY_S)", step_delay)
    sampler = gpuutil.open_sampler(device)
    if isinstance(sampler, gpuutil.NotMeasured):
        ctx.log.info("GPU utilisation not measured: %s", sampler.reason)
    sampler.start()
    try:
        while True:
            writer.raise_error()
            reason = ctx.control.stop_reason()
            if reason is not None:
                _leave(ctx)  # a member leaves its batch at once: the others go on without it
                running.result()  # settled before the stop's own writes (a StaleEpoch is raised here)
                return _stop(ctx, reason, writer, store, pipe, state)
            if state.next_step >= req.steps:
                break
            if ctx.batch is None:
                denoise.denoise_step(pipe, req, state)
            else:
                ctx.batch.step(pipe, req, state)
            if step_delay:
                time.sleep(step_delay)
            steps_run += 1
            if steps_run == 1:
                phases.mark("first_step")
                if running.result():  # settled before the first progress write
                    ctx.log.info("job is RUNNING (epoch %d)", env.epoch)
            ckpts.tick()
            ctx.reporter.progress(state.next_step, req.steps)
            # Due and the writer can take it now: otherwise stay due and ask again after the next step, so
            # the snapshot (a device-to-host copy on a GPU) is taken only when it will be uploaded, and fresh.
            ckpts.maybe_take(state.next_step, req.steps, lambda: denoise.snapshot(pipe, state))
        loop_end = time.time()
        running.result()  # settled here when no step ran (a job resumed at its last step)
        _leave(ctx)
        ckpts.drain()
        writer.raise_error()
    finally:
        running.wait()  # never left in flight (on a crash the stage's own error is the one reported)
        _leave(ctx)
        busy = sampler.stop()
        writer.close()

    frames = denoise.decode(pipe, state.latents) if ctx.batch is None else ctx.batch.decode(pipe, state.latents)
    reason = ctx.control.stop_reason()
    if reason is not None:
        return _stop(ctx, reason, writer, store, pipe, state)
    meta = {"job_id": env.job_id, "epoch": env.epoch, "model": w.model, "model_hash": model.content_hash,
            "prompt_sha256": hashlib.sha256(w.prompt.encode()).hexdigest(), "fps": FPS,
            "width": w.width, "height": w.height, "generated_width": req.width, "generated_height": req.height,
            "steps": req.steps, "seed": req.seed}
    data = pack_output(frames, meta)
    ctx.reporter.flush()  # the last step's progress (written while the frames decoded) lands before the output
    key = f"{env.s3.output_prefix}generated/e{env.epoch:04d}.npz"
    ctx.objects.put_bytes(env.s3.bucket_outputs, key, data, metadata={"sha256": sha256_hex(data)})
    ref = {"key": key, "sha256": sha256_hex(data)}
    # the mean of the steps after the first (the first pays warm-up: it is its own phase)
    first = phases.record.get("first_step")
    mean = {"mean_step_s": max(0.0, (loop_end - first) / (steps_run - 1))} if steps_run > 1 and first and loop_end else {}
    shared = {} if ctx.batch is None or ctx.batch.alone else {
        "batch_members": ctx.batch.widest(), "batch_gpu_s": round(ctx.batch.share_s(), 4)}
    phases.mark("generation_done", steps=steps_run, checkpoint_stall=round(ckpts.stall_s, 3), **mean,
                **(busy.as_phases() if busy is not None else {}), **shared)
    # the output's reference (the job item) and the phase timings (the attempt item) are independent writes: side
    # by side, both settled before the stage ends (the outcome's report, which CompleteRun reads them on, comes after)
    timings = Overlapped(lambda: _record_phases(ctx, phases), name="record-phases")
    try:
        ctx.job.set_generated(ref)
    finally:
        timings.wait()
    ctx.result["generated"] = ref
    ctx.log.info("inference output persisted at %s", key)
    return ExitCode.SUCCEEDED


def stage_inputs(ctx: StageContext, js: JobSpec, phases: PhaseRecorder, sleep=time.sleep) -> None:
    """Stage the job's inputs and mark ``inputs_staged`` (contract 2). A development runtime's
    ``fault_staging_delay_s`` (a test fault; :class:`gpufleet.runtime.settings.RuntimeSettings` refuses it
    without ``dev_mode``) makes staging that much longer, with or without inputs."""
    env, cache = ctx.envelope, ctx.settings.cache_path
    delay = ctx.settings.fault_staging_delay_s if ctx.settings.dev_mode else 0.0
    if not js.data.inputs and not delay:
        return
    if js.data.inputs:
        report = Stager(ctx.objects, cache, reverify_s=ctx.settings.cache_reverify_s).stage(js.data.inputs, cache / "jobs" / env.job_id / "inputs")
        ctx.job.record_attempt({"staging": report.as_item()})
        ctx.log.info("staged %d inputs: %d bytes moved, %d from cache, %.2fs", len(js.data.inputs),
                     report.bytes_moved, report.bytes_cached, report.seconds)
    if delay:
        ctx.log.warning("test fault: staging delayed by %.1fs (GPUFLEET_FAULT_STAGING_DELAY_S)", delay)
        sleep(delay)
    phases.mark("inputs_staged")


#: the most of its file system a host cache the runtime evicts may fill, whatever ``cache_max_bytes`` says
HOST_CACHE_DISK_SHARE = 0.5


def evict_host_cache(ctx: StageContext, keep: str) -> None:
    """A host cache the runtime evicts itself (``cache_max_bytes``: a Batch GPU instance's, which no agent looks
    after): remove the least recently used entries beyond the bound (``cache_max_bytes``, and at most
    :data:`HOST_CACHE_DISK_SHARE` of the file system), never ``keep`` (this run's model), one used within
    ``cache_min_age_s`` or one another job holds. Never fails the run: an eviction that fails is logged."""
    s = ctx.settings
    if s.cache_max_bytes is None:
        return
    try:
        cache = ContentCache(s.cache_path, s.cache_max_bytes, s.cache_min_age_s, clock=SystemClock(),
                             reverify_s=s.cache_reverify_s)
        # a root volume (an instance type without an instance store) also holds the images: half of it at most
        cache.max_bytes = bound = min(s.cache_max_bytes, int(shutil.disk_usage(cache.root).total
                                                             * HOST_CACHE_DISK_SHARE))
        removed = cache.evict(keep)
    except OSError as err:
        ctx.log.warning("host cache eviction failed: %s", err)
        return
    if removed:
        ctx.log.info("host cache: evicted %d least recently used entries (bound %d bytes)", len(removed), bound)


def _pipeline(model, device: str, phases: PhaseRecorder):
    """The model's pipeline: resident in a warm worker (no ``model_loaded`` mark: no model-load phase, the
    detail ``model_cache`` says ``resident``), else loaded now and marked."""
    warm = resident.RESIDENT
    if warm is None:
        pipe, was_resident = load_pipeline(model.path, device), False
    else:
        key = resident.ModelKey(model.name, model.content_hash, device)
        pipe, was_resident = warm.pipeline(key, model.path, lambda: load_pipeline(model.path, device))
    if was_resident:
        phases.record["model_cache"] = "resident"
    else:
        phases.mark("model_loaded", model_cache="miss" if model.bytes_downloaded else "hit",
                    model_bytes=int(model.bytes_downloaded))
    return pipe


def _leave(ctx: StageContext) -> None:
    """A batch member's steps are over (done or stopped): it leaves the batch (idempotent)."""
    if ctx.batch is not None:
        ctx.batch.leave()


def _stop(ctx: StageContext, reason: ExitCode, writer, store: CheckpointStore, pipe, state) -> ExitCode:
    if reason == ExitCode.PREEMPTED:  # a SIGTERM may be a cancel's (Batch's TerminateJob): then no checkpoint
        reason = refined_stop(ctx) or reason
    if reason == ExitCode.PREEMPTED:
        writer.flush()
        ref = store.save(state.next_step, denoise.serialize(denoise.snapshot(pipe, state)))
        ctx.log.warning("preempted (%s): checkpointed step %d at %s", ctx.control.detail, ref.step, ref.key)
        ctx.result["checkpoint"] = ref.as_item()
    else:
        ctx.log.warning("stopping: %s (%s)", reason.name, ctx.control.detail)
    return reason
