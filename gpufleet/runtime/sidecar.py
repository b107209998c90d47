"""The ``container`` stage of a cloud container job's supervisor (``GPUFLEET_CONTAINER_SIDECAR=tenant``).

On Batch a cloud container job is one multi-container ECS task (:mod:`gpufleet.batchdef`): this process is the
``supervisor`` container; ECS starts the tenant's image (the ``tenant`` container) once the ``gate`` container saw
:data:`gpufleet.batchdef.READY_FILE`. The supervisor has no AWS identity of its own: :func:`gpufleet.runtime.main`
exchanged its one-time token at the node API (:func:`gpufleet.store.nodeapi.worker_adapters`), so every job-item
write below is a node API call the server checks (its own job, its current epoch) and every object it reads or
writes is within the attempt's session policy, as for an on-prem node.

Contract (the on-prem stage's, :mod:`gpufleet.runtime.container`, where it can be):
- The job volume is ``settings.sidecar_job_dir`` (``/job``): ``inputs/`` (``spec.data.inputs`` staged, read-only
  in the tenant), ``output/`` and ``checkpoint/`` (the job's latest valid checkpoint restored first), both
  writable by the tenant's user (:data:`gpufleet.batchdef.TENANT_USER`).
- Then the job moves SCHEDULED→RUNNING (fenced) and the ready file is written: from here ECS runs the tenant.
- :class:`gpufleet.runtime.taskmeta.TenantWatch` reads the task metadata until the tenant STOPPED; meanwhile the
  checkpoint directory is uploaded every ``checkpoint_interval_s`` when it changed, and once more at the end.
- Tenant exit 0 → its output files are checked against the per-job cap and uploaded
  (:func:`gpufleet.runtime.container.upload_output_files`); 126/127 or another non-zero exit → USER_ERROR,
  except above 128 (killed by a signal) → SYSTEM_ERROR; stopped without an exit code (it never started) →
  SYSTEM_ERROR.
- Cancel, spot notice, SIGTERM, the run-time limit: the watch ends at once, the checkpoint directory is
  uploaded and the stage returns that reason (a SIGTERM's after one read of the job: Batch's TerminateJob for a
  cancel is a SIGTERM too, :func:`gpufleet.runtime.context.refined_stop`); the supervisor is the task's essential container, so its exit
  stops the tenant (Batch/ECS). Fenced: no upload.
- The tenant's log lines are not this process's (ECS ships them with the task's log configuration).
- ``task_heartbeat`` (a cloud supervisor's: the node API's ``heartbeat``, which keeps the workflow's
  ``.waitForTaskToken`` state alive, as an on-prem agent's heartbeats do) is called about every third of the
  envelope's ``heartbeat_seconds`` while the tenant runs.
- :func:`report_outcome` is the supervisor's last call (from :func:`gpufleet.runtime.main.main`, after the
  stage): ``complete`` with the attempt's GPU-seconds (wall time × the whole GPUs Batch gave it) on success,
  else ``fail`` with the exit code's name and the detail — what an on-prem agent reports for its runtime. An
  answer saying the attempt is no longer this supervisor's (410/409/403) is logged, not raised.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.batchdef import READY_FILE, TENANT_USER
from gpufleet.envelope import ExitCode
from gpufleet.errors import NotAllowed, StaleEpoch, TaskGone, TransientError, ValidationFailed
from gpufleet.runtime.checkpoint import CheckpointStore
from gpufleet.runtime.container import (
    DirSync,
    _validate_tar,
    pack_dir,
    regular_files,
    unpack_dir,
    upload_output_files,
)
from gpufleet.runtime.context import StageContext, refined_stop
from gpufleet.runtime.staging import Stager
from gpufleet.runtime.taskmeta import TenantWatch, endpoint_fetch
from gpufleet.spec import ContainerJob
from gpufleet.store.objectstore import sha256_hex

#: the ready file's name in the job volume (``READY_FILE`` is its path in the containers)
READY_NAME = Path(READY_FILE).name


def _give_to_tenant(folder: Path) -> None:
    """Make ``folder`` the tenant user's (``chown`` as root on Batch; else world-writable: the local emulation)."""
    uid, gid = (int(x) for x in TENANT_USER.split(":"))
    try:
        os.chown(folder, uid, gid)
    except PermissionError:
        os.chmod(folder, 0o777)


def prepare(ctx: StageContext, work: Path, pointer: dict | None) -> tuple[DirSync, bool]:
    """Stage inputs, restore the checkpoint, hand ``output/`` and ``checkpoint/`` to the tenant's user."""
    env, s = ctx.envelope, ctx.settings
    input_dir, output_dir, ckpt_dir = work / "inputs", work / "output", work / "checkpoint"
    for d in (input_dir, output_dir, ckpt_dir):
        d.mkdir(parents=True, exist_ok=True)
    if env.spec.data.inputs:
        report = Stager(ctx.objects, s.cache_path, reverify_s=s.cache_reverify_s).stage(env.spec.data.inputs, input_dir)
        ctx.job.record_attempt({"staging": report.as_item()})
    store = CheckpointStore(
        ctx.objects,
        env.s3.bucket_checkpoints,
        env.s3.checkpoint_prefix,
        env.epoch,
        lambda ref: ctx.job.set_checkpoint(ref.key, ref.sha256, ref.step),
    )
    restored = store.load(pointer, _validate_tar)
    if restored:
        unpack_dir(restored[1], ckpt_dir)
        ctx.log.info("restored checkpoint %s", restored[0].key)
    for p in (work, input_dir):
        os.chmod(p, 0o755)
    for d in (output_dir, ckpt_dir):
        _give_to_tenant(d)
    sync = DirSync(store, None, ckpt_dir, tar=lambda: pack_dir(ckpt_dir))
    if restored:  # the restored content is already the job's checkpoint: upload only what changes it
        sync.last_hash = sha256_hex(sync.snapshot())
    return sync, bool(restored)


def run(
    ctx: StageContext,
    *,
    watch: TenantWatch | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    task_heartbeat: Callable[[], object] | None = None,
) -> ExitCode:
    env, s = ctx.envelope, ctx.settings
    w = env.spec.workload
    if not isinstance(w, ContainerJob):
        raise ValidationFailed("the container stage needs a container workload")
    item = ctx.job.check_current()
    if item.get("cancel_requested"):
        return ExitCode.CANCELLED
    work = Path(s.sidecar_job_dir)
    sync, _ = prepare(ctx, work, item.get("checkpoint"))
    if ctx.job.mark_running():
        ctx.log.info("job is RUNNING (epoch %d)", env.epoch)
    (work / READY_NAME).write_text(str(env.epoch))
    ctx.log.info("job directory ready: the tenant (%s) starts", w.image)
    watch = watch or TenantWatch(endpoint_fetch(), poll_s=s.sidecar_poll_s)
    last_upload = last_beat = monotonic()
    beat_every = max(1.0, env.heartbeat_seconds / 3)
    task_heartbeat = task_heartbeat or getattr(ctx.job, "task_heartbeat", None)

    def stopping() -> bool:
        nonlocal last_upload, last_beat
        if ctx.control.stop_reason() is not None:
            return True
        if task_heartbeat is not None and monotonic() - last_beat >= beat_every:
            try:
                task_heartbeat()
            except StaleEpoch:
                ctx.control.request(ExitCode.FENCED, "the attempt was fenced off")
                return True
            except (TaskGone, NotAllowed) as err:
                ctx.control.request(ExitCode.CANCELLED, f"the workflow no longer waits on this attempt: {err}")
                return True
            except TransientError as err:
                ctx.log.warning("task heartbeat failed: %s", err)
            last_beat = monotonic()
        if monotonic() - last_upload >= w.checkpoint_interval_s:
            if sync.upload():
                ctx.log.info("checkpoint directory uploaded")
            last_upload = monotonic()
        return False

    code = watch.wait(stop=stopping)
    reason = refined_stop(ctx)  # Batch's TerminateJob for a cancel is a SIGTERM too
    if reason == ExitCode.FENCED:
        return reason
    sync.upload()
    if reason is not None:
        ctx.log.warning("stopped (%s): checkpoint directory uploaded", ctx.control.detail or reason.name)
        return reason
    ctx.result["command_exit"] = code
    if code is None:
        ctx.result["detail"] = "the tenant container stopped without an exit code (it did not start)"
        ctx.log.error(ctx.result["detail"])
        return ExitCode.SYSTEM_ERROR
    if code == 0:
        return upload_output_files(ctx, regular_files(pack_dir(work / "output")))
    if code > 128:
        ctx.log.error("the tenant's command was killed by signal %d", code - 128)
        return ExitCode.SYSTEM_ERROR
    ctx.log.error("the tenant's command exited with %d", code)
    return ExitCode.USER_ERROR


def report_outcome(job, code: ExitCode, result: dict, run_seconds: float, gpus: float, log) -> None:
    """The supervisor's report of its attempt through the node API (see module contract)."""
    try:
        if code is ExitCode.SUCCEEDED:
            gpu_seconds = max(0.0, float(run_seconds)) * max(1, math.ceil(gpus))
            job.api.attempt(job.job_id, job.epoch, "complete", {"gpu_seconds": round(gpu_seconds, 3)})
        else:
            job.api.attempt(
                job.job_id, job.epoch, "fail", {"error": code.name, "detail": str(result.get("detail") or "")[:4000]}
            )
    except (TaskGone, StaleEpoch, NotAllowed) as err:
        log.warning("outcome %s not accepted: the attempt is no longer this supervisor's (%s)", code.name, err)
