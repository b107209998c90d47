"""The ``container`` stage: run the tenant's image in an isolated container, with checkpoint-directory sync to S3.

This process is the supervisor (heartbeats, checkpoint sync, log shipping, fencing); it stays
outside the container. The container is started with podman, rootless, with the flags of
:func:`gpufleet.runtime.oci.run_argv` (docs/runtime.md, "Isolation"): the image it names and
nothing of the host's interpreter, environment or files besides its own job directory.

Contract (environment contract documented in docs/runtime.md):
- The image must match this node's ``image_allowlist`` and exist in the node's image store
  (nodes never pull); otherwise USER_ERROR before anything runs.
- The attempt's job directory is ``<jobs_dir>/<job>/e<epoch>/``: ``inputs/`` (``spec.data.inputs``
  staged through the node cache), ``output/`` and ``checkpoint/``. Before start, the job's latest
  valid checkpoint (a tar of the checkpoint directory, through :class:`CheckpointStore`: atomic
  PUT, hash-verified, fallback to the previous one) is extracted into ``checkpoint/``.
- In the container: ``/job/inputs`` (read-only), ``/job/output``, the checkpoint directory at
  ``spec.checkpoint_dir`` or ``/job/checkpoint``, tmpfs ``/job/scratch`` (the working directory
  and ``HOME``) and ``/tmp``. The environment is the spec's ``env`` plus ``GPUFLEET_JOB_ID``,
  ``GPUFLEET_ATTEMPT``, ``GPUFLEET_EPOCH``, ``GPUFLEET_CHECKPOINT_DIR``, ``GPUFLEET_INPUT_DIR``,
  ``GPUFLEET_OUTPUT_DIR``, ``GPUFLEET_SCRATCH_DIR``, ``GPUFLEET_RESUMED`` (1 after a restore),
  ``GPUFLEET_GRACE_SECONDS``, ``HOME`` and ``TMPDIR``, and for a gang member the torchrun variables of
  :func:`gpufleet.gang.dist_env` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, …), and ``TRACEPARENT`` (the
  job's W3C trace, :mod:`gpufleet.tracing`, the OpenTelemetry environment carrier) when it has one — nothing
  of this process's environment.
- A gang member's container and job directory are per rank (``gpufleet-<job>-e<epoch>-r<rank>``,
  ``e<epoch>-r<rank>/``: two members may share a host). Its network follows the site's ``gang_network``
  (:mod:`gpufleet.runtime.gangnet`): under ``local`` a member other than rank 0 waits for rank 0's container
  to run and joins its namespace (SYSTEM_ERROR if it does not run within ``JOIN_TIMEOUT_S``, or is no longer
  the same process once the member runs); ``MASTER_ADDR`` and the socket interface variables are the plan's.
  The GPUs of ``CUDA_VISIBLE_DEVICES`` (set by the agent) are passed as CDI devices, and only
  they. The container's stdout/stderr lines go to the job log.
- Just before the container starts the job moves SCHEDULED→RUNNING (fenced,
  :meth:`JobItem.mark_running`).
- The checkpoint directory is uploaded every ``checkpoint_interval_s`` when its content
  changed, and once more when the command ends or is stopped. Tenant files are read as a tar
  streamed by ``podman unshare`` (symlinks stored, never followed).
- SIGTERM / spot notice: the container is stopped — SIGTERM to its command (the container's
  init forwards it), SIGKILL to everything in it after ``container_grace_s`` — the directory is
  uploaded, exit PREEMPTED. Cancel (seen by the runtime's own reads or the agent's SIGUSR1) or the time
  limit → the same stop with ``container_cancel_grace_s`` (at most 4 s, so a cancelled container is gone
  within 5 s, before the agent's SIGKILL), exit CANCELLED / TIMED_OUT. Fenced → SIGKILL at once,
  no upload, FENCED. If this process dies, however it dies, a detached reaper removes the
  container (:meth:`Podman.start_reaper`).
- Command exit 0 → the regular files of the output directory are checked against the envelope's
  per-job cap (``s3.output_max_bytes`` / ``output_max_files``; over it → USER_ERROR, nothing
  uploaded), uploaded under ``<output_prefix>output/e<epoch:04d>/`` (:func:`output_key`) and the
  fenced ``generated`` pointer ``{"key", "sha256", "files", "bytes"}`` is set; non-zero exit →
  USER_ERROR (126/127: not executable / not found); killed by a signal we did not send (exit
  128+n) → SYSTEM_ERROR, and for a crash signal (:data:`gpufleet.crash.CRASH_SIGNALS`) the attempt's
  ``crash`` fingerprint of the container's last output lines is recorded; podman itself failing
  (125) → SYSTEM_ERROR.
- The attempt's job directory is removed when the stage ends.
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import subprocess
import tarfile
import threading
import time
from collections import deque
from pathlib import Path

from gpufleet import crash
from gpufleet.envelope import ExitCode
from gpufleet.errors import ConfigError, ValidationFailed
from gpufleet.gang import dist_env
from gpufleet.images import allowed
from gpufleet.runtime import gangnet, oci
from gpufleet.runtime.checkpoint import CheckpointStore
from gpufleet.runtime.context import StageContext, record_crash, refined_stop
from gpufleet.runtime.staging import Stager
from gpufleet.spec import ContainerJob, JobSpec
from gpufleet.store.objectstore import sha256_hex

POLL_S = 0.1


def pack_dir(folder: Path) -> bytes:
    """Deterministic tar of ``folder`` (sorted, zero mtimes/owners; regular files and directories only,
    symlinks skipped): same content → same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(folder.rglob("*")):
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                continue
            info = tar.gettarinfo(str(p), arcname=p.relative_to(folder).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if p.is_file():
                with open(p, "rb") as fh:
                    tar.addfile(info, fh)
            else:
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


def normalize_tar(data: bytes) -> bytes:
    """The same tree as a deterministic tar with relative names (no ``./``): directories and regular files
    only, sorted, zero times and owners, modes kept. Links, devices and fifos are dropped."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as src, tarfile.open(fileobj=buf, mode="w") as out:
        members = []
        for m in src.getmembers():
            name = os.path.normpath(m.name).lstrip("/")
            if name in (".", "") or name.startswith("..") or not (m.isfile() or m.isdir()):
                continue
            members.append((name, m))
        for name, m in sorted(members, key=lambda nm: nm[0]):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = m.type, m.mode & 0o7777, m.size if m.isfile() else 0
            if m.isfile():
                out.addfile(info, src.extractfile(m))
            else:
                out.addfile(info)
    return buf.getvalue()


def regular_files(data: bytes) -> list[tuple[str, bytes]]:
    """``(relative path, content)`` of the regular files in a tar (links, devices and the like skipped)."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            name = os.path.normpath(m.name).lstrip("/")
            if not m.isfile() or name.startswith("..") or name in (".", ""):
                continue
            fh = tar.extractfile(m)
            out.append((name, fh.read() if fh else b""))
    return sorted(out)


class DirSync:
    """Uploads a checkpoint directory when its content changed (``tar``: how to read it; default podman's)."""

    def __init__(self, store: CheckpointStore, podman: oci.Podman | None, folder: Path, tar=None) -> None:
        self.store = store
        self.podman = podman
        self.folder = folder
        self.tar = tar or (lambda: self.podman.tar_dir(self.folder))
        self.last_hash: str | None = None

    def snapshot(self) -> bytes:
        return normalize_tar(self.tar())

    def upload(self) -> bool:
        data = self.snapshot()
        digest = sha256_hex(data)
        if digest == self.last_hash:
            return False
        self.store.save(int(time.time() * 1000), data)
        self.last_hash = digest
        return True


def _pump(stream, log, tail: deque) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        log.info("[job] %s", line)
    stream.close()


def output_key(output_prefix: str, epoch: int, rel: str = "") -> str:
    """Where the files of attempt ``epoch`` go: ``<output_prefix>output/e<epoch:04d>/<rel>``. Per epoch, so
    a fenced-off worker's late uploads never mix with the published attempt's files."""
    return f"{output_prefix}output/e{epoch:04d}/{rel}"


def _upload_outputs(ctx: StageContext, podman: oci.Podman, output_dir: Path) -> ExitCode:
    """Check the output directory against the envelope's caps, then upload it and set ``generated``."""
    return upload_output_files(ctx, regular_files(podman.tar_dir(output_dir)))


def upload_output_files(ctx: StageContext, files: list[tuple[str, bytes]]) -> ExitCode:
    """Check the job's output ``files`` ``(relative name, bytes)`` against the envelope's caps, then upload them
    under :func:`output_key` and set the fenced ``generated`` pointer (USER_ERROR over the cap, nothing uploaded)."""
    env = ctx.envelope
    total = sum(len(data) for _, data in files)
    cap_bytes, cap_files = env.s3.output_max_bytes, env.s3.output_max_files
    if (cap_bytes is not None and total > cap_bytes) or (cap_files is not None and len(files) > cap_files):
        detail = (f"the job wrote {total} bytes in {len(files)} files to its output directory; the per-job cap is "
                  f"{cap_bytes} bytes in {cap_files} files")
        ctx.result["detail"] = detail
        ctx.log.error("%s: nothing was uploaded", detail)
        return ExitCode.USER_ERROR
    digests = {}
    for rel, data in files:
        ctx.objects.put_bytes(env.s3.bucket_outputs, output_key(env.s3.output_prefix, env.epoch, rel), data)
        digests[rel] = sha256_hex(data)
    ref = {"key": output_key(env.s3.output_prefix, env.epoch), "sha256": sha256_hex(repr(sorted(digests.items())).encode()),
           "files": len(digests), "bytes": total}
    ctx.job.set_generated(ref)
    ctx.result["generated"] = ref
    return ExitCode.SUCCEEDED


def _halt(podman: oci.Podman, proc: subprocess.Popen, name: str, grace_s: float | None) -> None:
    """Stop the container: ``grace_s`` None = SIGKILL now, else SIGTERM then SIGKILL after ``grace_s``.
    Falls back to removing it by force, and at last to killing the podman client."""
    if grace_s is None:
        podman.kill(name)
    else:
        podman.stop(name, grace_s)
    try:
        proc.wait(timeout=5)
        return
    except subprocess.TimeoutExpired:
        pass
    podman.remove(name)  # e.g. stop arrived while the container was still being created
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _gpus() -> list[str]:
    """The GPUs the agent placed this attempt on (CUDA_VISIBLE_DEVICES of this process)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [g.strip() for g in raw.split(",") if g.strip() and g.strip() != "-1"]


def _fresh(work: Path, podman: oci.Podman) -> None:
    if work.exists():  # a rerun of the same attempt: start clean
        _remove_work(work, podman)
    for d in ("inputs", "output", "checkpoint"):
        (work / d).mkdir(parents=True, exist_ok=True)
    for p in (work, *(work / d for d in ("inputs", "output", "checkpoint"))):
        os.chmod(p, 0o755)


def _remove_work(work: Path, podman: oci.Podman) -> None:
    try:
        podman.reclaim(work)
    except ConfigError:
        pass  # best effort; rmtree below reports what it cannot remove
    shutil.rmtree(work, ignore_errors=True)


def run(ctx: StageContext) -> ExitCode:
    env = ctx.envelope
    s = ctx.settings
    js = env.spec
    if not isinstance(js.workload, ContainerJob):
        raise ValidationFailed("the container stage needs a container workload")
    w = js.workload
    item = ctx.job.check_current()
    if item.get("cancel_requested"):
        return ExitCode.CANCELLED
    if not allowed(w.image, s.image_allowlist):
        raise ValidationFailed(f"image {w.image!r} is not in this node's image allowlist")
    podman = oci.Podman(s.oci_podman, user=s.oci_user, oci_runtime=s.oci_runtime,
                        cgroup_manager=s.oci_cgroup_manager)
    image_id = podman.image_id(w.image)
    if image_id is None:
        raise ValidationFailed(f"image {w.image!r} is not in this node's image store (nodes never pull images)")
    gpus = _gpus()
    if gpus and not oci.cdi_gpus_available():
        raise ConfigError(f"GPUs {','.join(gpus)} were assigned but no CDI spec for {oci.CDI_GPU_KIND} is installed "
                          "(nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)")
    ctx.result["image"] = {"ref": w.image, "id": image_id}
    ctx.log.info("image %s is %s", w.image, image_id)

    work = s.jobs_path / env.job_id / (f"e{env.epoch:04d}" + (f"-r{env.gang.rank}" if env.gang else ""))
    _fresh(work, podman)
    try:
        return _run_container(ctx, js, w, podman, work, item.get("checkpoint"))
    finally:
        _remove_work(work, podman)


def _run_container(ctx: StageContext, js: JobSpec, w: ContainerJob, podman: oci.Podman, work: Path,
                   pointer: dict | None) -> ExitCode:
    env, s = ctx.envelope, ctx.settings
    input_dir, output_dir, ckpt_dir = work / "inputs", work / "output", work / "checkpoint"
    if js.data.inputs:
        report = Stager(ctx.objects, s.cache_path, reverify_s=s.cache_reverify_s).stage(js.data.inputs, input_dir)
        ctx.job.record_attempt({"staging": report.as_item()})

    store = CheckpointStore(ctx.objects, env.s3.bucket_checkpoints, env.s3.checkpoint_prefix, env.epoch,
                            lambda ref: ctx.job.set_checkpoint(ref.key, ref.sha256, ref.step))
    restored = store.load(pointer, _validate_tar)
    if restored:
        unpack_dir(restored[1], ckpt_dir)
        ctx.log.info("restored checkpoint %s", restored[0].key)
    podman.hand_over(work)
    oci.check_traversable(work, podman.owner_uid, podman.owner_gid)
    sync = DirSync(store, podman, ckpt_dir)
    if restored:
        sync.last_hash = sha256_hex(sync.snapshot())

    ckpt_in = w.checkpoint_dir or oci.CHECKPOINT_DIR
    role = env.gang
    name = oci.container_name(env.job_id, env.epoch, role.rank if role else None)
    net = gangnet.plan(s.gang_network, role, s.oci_network)
    joined: tuple[str, int] | None = None
    if net.network is None:  # join rank 0's namespace (gang_network local)
        rank0 = oci.container_name(env.job_id, env.epoch, 0)
        joined = gangnet.join_rank0(podman.running_pid, rank0, lambda: ctx.control.stop_reason() is not None)
        if joined is None:
            reason = ctx.control.stop_reason()
            if reason is not None:
                return reason
            ctx.result["detail"] = f"rank 0's container {rank0} was not running within {gangnet.JOIN_TIMEOUT_S:g} s"
            ctx.log.error("%s: this member cannot join its network", ctx.result["detail"])
            return ExitCode.SYSTEM_ERROR
        rank0_ns = podman.netns_id(joined[1])
        if rank0_ns is None:  # rank 0 ended between the two reads: nothing to join (its pid may be reused)
            ctx.result["detail"] = f"rank 0's container {rank0} ended before this member could join its network"
            ctx.log.error("%s", ctx.result["detail"])
            return ExitCode.SYSTEM_ERROR
        ctx.log.info("joining the network namespace of %s (pid %d, %s)", rank0, joined[1], rank0_ns)
    spec = oci.ContainerSpec(
        name=name, image=w.image, command=list(w.command),
        env={**w.env, "GPUFLEET_JOB_ID": env.job_id, "GPUFLEET_ATTEMPT": str(env.attempt),
             "GPUFLEET_EPOCH": str(env.epoch), "GPUFLEET_CHECKPOINT_DIR": ckpt_in,
             "GPUFLEET_INPUT_DIR": oci.INPUT_DIR, "GPUFLEET_OUTPUT_DIR": oci.OUTPUT_DIR,
             "GPUFLEET_SCRATCH_DIR": oci.SCRATCH_DIR, "GPUFLEET_RESUMED": "1" if restored else "0",
             "GPUFLEET_GRACE_SECONDS": str(s.container_grace_s), "HOME": oci.SCRATCH_DIR, "TMPDIR": "/tmp",
             **dist_env(role), **net.env, **({"TRACEPARENT": env.traceparent} if env.traceparent else {})},
        uid=oci.job_uid(env.job_id, s.oci_uid_base, s.oci_uid_span),
        mounts=[oci.Mount(input_dir, oci.INPUT_DIR, False), oci.Mount(output_dir, oci.OUTPUT_DIR, True),
                oci.Mount(ckpt_dir, ckpt_in, True)],
        gpus=_gpus(), network=joined[0] if joined else str(net.network),
        nofile=oci.host_ulimit(resource.RLIMIT_NOFILE, s.oci_nofile),
        nproc=oci.host_ulimit(resource.RLIMIT_NPROC, s.oci_nproc),
        scratch_mb=s.oci_scratch_mb, tmp_mb=s.oci_tmp_mb, labels={oci.JOB_LABEL: env.job_id},
    )
    if ctx.job.mark_running():
        ctx.log.info("job is RUNNING (epoch %d)", env.epoch)
    ctx.log.info("starting %s in %s as uid %d", w.command, w.image, spec.uid)
    reaper = podman.start_reaper(name)
    try:
        code = _supervise(ctx, w, podman, spec, sync, output_dir, joined and (rank0, rank0_ns))
    except BaseException:
        os.close(reaper)  # end of file: the reaper makes sure the container is gone
        raise
    # the ``podman run`` has ended (waited for): what may be left is the container itself, its ``--rm`` still in
    # flight or a stop that did not take. Removed here, so that the reaper is set to work only when that fails:
    # a reaper at work kills any ``podman run`` of this name for up to 30 s, which a rerun of the name would meet
    if podman.run("container", "exists", name, check=False).returncode == 0:
        podman.remove(name)
    if podman.run("container", "exists", name, check=False).returncode == 0:
        os.close(reaper)  # still there: the reaper keeps removing it
    else:
        podman.dismiss_reaper(reaper)  # the container is gone: nothing for the reaper to do
    return code


def _supervise(ctx: StageContext, w: ContainerJob, podman: oci.Podman, spec: oci.ContainerSpec, sync: DirSync,
               output_dir: Path, joined: tuple[str, int] | None = None) -> ExitCode:
    """Run the container to its end or a stop. ``joined``: (rank 0's container, the identity of its network
    namespace) that the container joined: once the container runs, its own namespace must be that one, else it
    is killed (:func:`gpufleet.runtime.gangnet.same_namespace`)."""
    s = ctx.settings
    proc = podman.popen(*oci.run_argv(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, start_new_session=True)
    tail: deque = deque(maxlen=crash.TAIL_LINES)
    pump = threading.Thread(target=_pump, args=(proc.stdout, ctx.log, tail), daemon=True)
    pump.start()
    last_upload = time.monotonic()
    reason: ExitCode | None = None
    try:
        while proc.poll() is None:
            reason = ctx.control.stop_reason()
            if reason is not None:
                reason = refined_stop(ctx) or reason
                break
            member_pid = podman.running_pid(spec.name) if joined else None
            if joined and member_pid is not None:
                if not gangnet.same_namespace(joined[1], podman.netns_id(member_pid)):
                    ctx.result["detail"] = (f"this member's network namespace is not that of rank 0's container "
                                            f"{joined[0]} (its pid was reused)")
                    ctx.log.error("%s: stopping", ctx.result["detail"])
                    reason = ExitCode.SYSTEM_ERROR
                    break
                joined = None
            if time.monotonic() - last_upload >= w.checkpoint_interval_s:
                if sync.upload():
                    ctx.log.info("checkpoint directory uploaded")
                last_upload = time.monotonic()
            ctx.control.stop_event.wait(POLL_S)
    finally:
        if proc.poll() is None:
            short = min(s.container_grace_s, s.container_cancel_grace_s)  # within the agent's cancel_grace_s
            grace = {ExitCode.FENCED: None, ExitCode.SYSTEM_ERROR: None, ExitCode.CANCELLED: short,
                     ExitCode.TIMED_OUT: short}
            _halt(podman, proc, spec.name, grace.get(reason, s.container_grace_s))
        pump.join(timeout=5)
    if reason == ExitCode.FENCED:
        return reason
    sync.upload()
    if reason is not None:
        ctx.log.warning("stopped (%s): checkpoint directory uploaded", ctx.control.detail or ctx.result.get("detail"))
        return reason
    code = proc.returncode
    ctx.result["command_exit"] = code
    if code == 0:
        return _upload_outputs(ctx, podman, output_dir)
    if code == oci.PODMAN_FAILED:
        ctx.log.error("podman could not run the container (exit 125; see the lines above)")
        return ExitCode.SYSTEM_ERROR
    if code in (oci.NOT_EXECUTABLE, oci.NOT_FOUND):
        ctx.log.error("command %r could not be started in the image (exit %d)", w.command[0], code)
        return ExitCode.USER_ERROR
    if code > 128:
        ctx.log.error("command killed by signal %d", code - 128)
        if code - 128 in crash.CRASH_SIGNALS:  # the program crashed itself: comparable across nodes
            record_crash(ctx, code, list(tail))
        return ExitCode.SYSTEM_ERROR
    ctx.log.error("command exited with %d", code)
    return ExitCode.USER_ERROR
