"""The ``container`` stage: run a user command with checkpoint-directory sync to S3.

Contract (environment contract documented in docs/runtime.md):
- Before start, the job's latest valid checkpoint (a tar of the checkpoint
  directory, through :class:`CheckpointStore`: atomic PUT, hash-verified,
  fallback to the previous one) is extracted into ``GPUFLEET_CHECKPOINT_DIR``.
  Inputs from ``spec.data.inputs`` are staged into ``GPUFLEET_INPUT_DIR``.
- Just before the command starts the job moves SCHEDULED→RUNNING (fenced,
  :meth:`JobItem.mark_running`).
- The command runs in its own process group (``start_new_session``) with the
  spec's ``env`` plus ``GPUFLEET_JOB_ID``, ``GPUFLEET_ATTEMPT``,
  ``GPUFLEET_EPOCH``, ``GPUFLEET_CHECKPOINT_DIR``, ``GPUFLEET_INPUT_DIR``,
  ``GPUFLEET_OUTPUT_DIR``, ``GPUFLEET_RESUMED`` (1 after a restore) and
  ``GPUFLEET_GRACE_SECONDS``; ``CUDA_VISIBLE_DEVICES`` is inherited. Its
  stdout/stderr lines go to the job log.
- The directory is uploaded every ``checkpoint_interval_s`` when its content
  changed, and once more when the command ends or is stopped.
- SIGTERM / spot notice: SIGTERM is forwarded to the process group, SIGKILL
  follows after the grace period, the directory is uploaded, exit PREEMPTED.
  Cancel → the same stop, exit CANCELLED. Fenced → SIGKILL at once, no upload, FENCED.
- Command exit 0 → the output directory is uploaded under
  ``<output_prefix>output/`` and the fenced ``generated`` pointer is set;
  non-zero exit → USER_ERROR; killed by a signal we did not send → SYSTEM_ERROR.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from gpufleet.envelope import ExitCode
from gpufleet.errors import ValidationFailed
from gpufleet.runtime.checkpoint import CheckpointStore
from gpufleet.runtime.context import StageContext
from gpufleet.runtime.staging import Stager
from gpufleet.spec import ContainerJob, JobSpec
from gpufleet.store.objectstore import sha256_hex

POLL_S = 0.1


def pack_dir(folder: Path) -> bytes:
    """Deterministic tar of ``folder`` (sorted, zero mtimes/owners): same content → same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(folder.rglob("*")):
            info = tar.gettarinfo(str(p), arcname=p.relative_to(folder).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if p.is_file():
                with open(p, "rb") as fh:
                    tar.addfile(info, fh)
            elif p.is_dir():
                tar.addfile(info)
    return buf.getvalue()


def unpack_dir(data: bytes, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(folder, filter="data")


def _validate_tar(data: bytes) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.getmembers()
    except tarfile.TarError as err:
        raise ValueError(f"not a tar archive: {err}")
    return data


class _DirSync:
    def __init__(self, store: CheckpointStore, folder: Path) -> None:
        self.store = store
        self.folder = folder
        self.last_hash: str | None = None

    def upload(self) -> bool:
        data = pack_dir(self.folder)
        digest = sha256_hex(data)
        if digest == self.last_hash:
            return False
        self.store.save(int(time.time() * 1000), data)
        self.last_hash = digest
        return True


def _pump(stream, log) -> None:
    for raw in iter(stream.readline, b""):
        log.info("[job] %s", raw.decode(errors="replace").rstrip())
    stream.close()


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait()


def run(ctx: StageContext) -> ExitCode:
    env = ctx.envelope
    try:
        js = JobSpec.model_validate(env.spec)
    except ValueError as err:
        raise ValidationFailed(f"invalid job spec: {err}")
    if not isinstance(js.workload, ContainerJob):
        raise ValidationFailed("the container stage needs a container workload")
    w = js.workload
    item = ctx.job.check_current()
    if item.get("cancel_requested"):
        return ExitCode.CANCELLED

    work = ctx.settings.cache_path / "jobs" / env.job_id / f"e{env.epoch:04d}"
    ckpt_dir = Path(w.checkpoint_dir) if w.checkpoint_dir else work / "checkpoint"
    input_dir, output_dir = work / "inputs", work / "output"
    for d in (ckpt_dir, input_dir, output_dir):
        d.mkdir(parents=True, exist_ok=True)
    if js.data.inputs:
        report = Stager(ctx.objects, ctx.settings.cache_path).stage(js.data.inputs, input_dir)
        ctx.job.record_attempt({"staging": report.as_item()})

    store = CheckpointStore(ctx.objects, env.s3.bucket_checkpoints, env.s3.checkpoint_prefix, env.epoch,
                            lambda ref: ctx.job.set_checkpoint(ref.key, ref.sha256, ref.step))
    restored = store.load(item.get("checkpoint"), _validate_tar)
    if restored:
        unpack_dir(restored[1], ckpt_dir)
        ctx.log.info("restored checkpoint %s into %s", restored[0].key, ckpt_dir)
    sync = _DirSync(store, ckpt_dir)
    if restored:
        sync.last_hash = sha256_hex(pack_dir(ckpt_dir))

    child_env = {**os.environ, **w.env,
                 "GPUFLEET_JOB_ID": env.job_id, "GPUFLEET_ATTEMPT": str(env.attempt),
                 "GPUFLEET_EPOCH": str(env.epoch), "GPUFLEET_CHECKPOINT_DIR": str(ckpt_dir),
                 "GPUFLEET_INPUT_DIR": str(input_dir), "GPUFLEET_OUTPUT_DIR": str(output_dir),
                 "GPUFLEET_RESUMED": "1" if restored else "0",
                 "GPUFLEET_GRACE_SECONDS": str(ctx.settings.container_grace_s)}
    if ctx.job.mark_running():
        ctx.log.info("job is RUNNING (epoch %d)", env.epoch)
    ctx.log.info("starting %s", w.command)
    try:
        proc = subprocess.Popen(w.command, env=child_env, cwd=work, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as err:
        raise ValidationFailed(f"cannot start command {w.command[0]!r}: {err}")
    pump = threading.Thread(target=_pump, args=(proc.stdout, ctx.log), daemon=True)
    pump.start()
    last_upload = time.monotonic()
    reason: ExitCode | None = None
    try:
        while proc.poll() is None:
            reason = ctx.control.stop_reason()
            if reason is not None:
                break
            if time.monotonic() - last_upload >= w.checkpoint_interval_s:
                if sync.upload():
                    ctx.log.info("checkpoint directory uploaded")
                last_upload = time.monotonic()
            ctx.control.stop_event.wait(POLL_S)
    finally:
        if proc.poll() is None:
            if reason == ExitCode.FENCED:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                _stop_group(proc, ctx.settings.container_grace_s)
        pump.join(timeout=5)
    if reason == ExitCode.FENCED:
        return reason
    sync.upload()
    if reason is not None:
        ctx.log.warning("stopped (%s): checkpoint directory uploaded", ctx.control.detail)
        return reason
    code = proc.returncode
    ctx.result["command_exit"] = code
    if code == 0:
        files = {}
        for p in sorted(output_dir.rglob("*")):
            if p.is_file():
                rel = p.relative_to(output_dir).as_posix()
                data = p.read_bytes()
                ctx.objects.put_bytes(env.s3.bucket_outputs, f"{env.s3.output_prefix}output/{rel}", data)
                files[rel] = sha256_hex(data)
        ref = {"key": f"{env.s3.output_prefix}output/", "sha256": sha256_hex(repr(sorted(files.items())).encode()),
               "files": len(files)}
        ctx.job.set_generated(ref)
        ctx.result["generated"] = ref
        return ExitCode.SUCCEEDED
    if code < 0:
        ctx.log.error("command killed by signal %d", -code)
        return ExitCode.SYSTEM_ERROR
    ctx.log.error("command exited with %d", code)
    return ExitCode.USER_ERROR
