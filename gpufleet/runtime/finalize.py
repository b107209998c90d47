"""The ``finalize`` stage (CPU): moderation → watermark → MP4 → C2PA → upload. Idempotent.

With ``finalize_overlap`` (the default) the watermarked MP4 is made on a second thread while moderation runs; it is
used only once the verdict clears the clip and dropped otherwise: nothing is signed, uploaded or written before the
verdict (docs/benchmarks.md "Finalize: the watermarked MP4 made while moderation runs").

Contract (see docs/runtime.md and docs/contracts.md):
- Reads only the persisted inference output named by the job's ``generated``
  pointer (hash verified); inference is never re-run here.
- Frames are upscaled (bicubic) to the delivery size: the spec's size, scaled
  up so the shorter side is at least 256 px (the watermark's minimum).
- Tier-2 moderation on the frames :mod:`gpufleet.safety.frame_selection` picks (every frame of a
  clip of at most ``max_frames``, else a uniform floor plus scene changes; the model on
  ``torch_threads`` CPU threads), with the settings CheckPrompt froze on
  the job item (``safety``: the tenant's profile, :mod:`gpufleet.safety.profile`)
  or, on a job without them, the deployment default (``moderation_backend`` and
  the backend's thresholds). The moderation result records the ``thresholds``
  applied and the ``profile_version`` (0: deployment default). Blocked output is
  never encoded or uploaded: the result is ``{"blocked": true, "moderation": {...}}``, and once it is
  recorded the raw generated output is moved to ``quarantine/<key>`` (:data:`QUARANTINE_PREFIX`: outside
  ``jobs/``, so no tenant-facing role or API route reaches it; the outputs bucket's ``quarantine``
  lifecycle rule deletes it) and its version under ``jobs/`` is deleted. A retry of a blocked job
  finishes a move an earlier try left half done.
- Otherwise: watermark (48-bit payload from the job id, embedded under the current watermark key,
  :mod:`gpufleet.provenance.watermark`; the key id goes into the manifest), H.264 MP4 (PyAV),
  C2PA manifest signed with the configured key (:func:`credentials`), uploads of ``<output_prefix>video.mp4`` and
  ``<output_prefix>video.c2pa`` (the manifest store), and the result
  ``{"blocked": false, "video_key", "manifest_key", "watermark_payload", "moderation"}``.
- The result is written to ``<output_prefix>finalize.json``; on the job item
  (fenced on the envelope's epoch, docs/contracts.md) the stage sets
  ``moderation`` (``{"blocked", "reason", "backend", "category", "scores", ...}``)
  and, when not blocked, ``output`` ``{"video_key", "manifest_key", "watermark_payload",
  "watermark_key_id", "video_sha256"}`` (Publish indexes it: :mod:`gpufleet.store.provenance`).
  A retry whose result file names the same source hash returns that result
  without redoing work.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

from gpufleet.envelope import ExitCode
from gpufleet.errors import ConfigError, Conflict, NotFound, TransientError, ValidationFailed
from gpufleet.provenance import keys, manifest, video, watermark
from gpufleet.runtime.context import StageContext
from gpufleet.runtime.generated import unpack_output
from gpufleet.safety.profile import FrozenSafety
from gpufleet.spec import VideoGenerate
from gpufleet.store.objectstore import sha256_hex

#: where a BLOCKED job's raw generated output goes (infra/data.py expires it; only the Batch job role writes it)
QUARANTINE_PREFIX = "quarantine/"


def quarantine(ctx: StageContext, bucket: str, key: str) -> None:
    """Move a blocked job's raw output under :data:`QUARANTINE_PREFIX` (idempotent)."""
    if ctx.objects.move_out_of_reach(bucket, key, QUARANTINE_PREFIX + key):
        ctx.log.info("blocked output %s moved to %s%s", key, QUARANTINE_PREFIX, key)


def credentials(ctx: StageContext) -> keys.SigningCredentials:
    """The C2PA signing credentials: the key and chain files (``signing_key``/``signing_chain``), else the
    Secrets Manager secret (``signing_secret_id``, read through ``ctx.secrets``), else — only in
    ``dev_mode`` — development credentials from the state dir. Otherwise a :class:`ConfigError` (the stage
    fails as a system error; after its retries MarkFinalizeFailed raises the FinalizeFailed alarm)."""
    s = ctx.settings
    if s.signing_key and s.signing_chain:
        return keys.load_credentials(s.signing_key, s.signing_chain)
    if s.signing_secret_id:
        if ctx.secrets is None:
            raise ConfigError("GPUFLEET_SIGNING_SECRET_ID is set but the stage has no Secrets Manager reader")
        return keys.credentials_from_secret(ctx.secrets.read(s.signing_secret_id), s.signing_secret_id)
    if s.dev_mode:
        ctx.log.warning("signing with development credentials (GPUFLEET_DEV_MODE): not for production")
        return keys.dev_credentials(s.state_dir)
    raise ConfigError("no C2PA signing key configured: set GPUFLEET_SIGNING_SECRET_ID (a deployed stack's finalize "
                      "job definition does) or GPUFLEET_SIGNING_KEY and GPUFLEET_SIGNING_CHAIN; development "
                      "credentials are used only with GPUFLEET_DEV_MODE=1")


def watermark_key(ctx: StageContext) -> watermark.WatermarkKey:
    """The current (first) watermark key: the key file (``watermark_keys``), else the Secrets Manager secret
    (``watermark_secret_id``, read through ``ctx.secrets``), else — only in ``dev_mode`` — the development key of
    the state dir. Otherwise a :class:`ConfigError`: a container that made a key of its own would stamp videos that
    no lookup or verifier of the deployment could read."""
    s = ctx.settings
    if s.watermark_keys:
        return keys.load_watermark_keys(s.watermark_keys)[0]
    if s.watermark_secret_id:
        if ctx.secrets is None:
            raise ConfigError("GPUFLEET_WATERMARK_SECRET_ID is set but the stage has no Secrets Manager reader")
        return keys.watermark_keys_from_secret(ctx.secrets.read(s.watermark_secret_id), s.watermark_secret_id)[0]
    if s.dev_mode:
        return keys.dev_watermark_keys(s.state_dir)[0]
    raise ConfigError("no watermark key configured: set GPUFLEET_WATERMARK_SECRET_ID (a deployed stack's finalize "
                      "paths do) or GPUFLEET_WATERMARK_KEYS; the development key is used only with GPUFLEET_DEV_MODE=1")


def frozen_safety(item: dict) -> FrozenSafety:
    """The job's frozen tier-2 settings; the deployment default for a job CheckPrompt did not freeze."""
    if not item.get("safety"):
        return FrozenSafety(source="default", profile_version=0)
    try:
        return FrozenSafety.model_validate(item["safety"])
    except ValueError as err:
        raise ConfigError(f"the job's frozen safety settings are invalid: {err}")


def run(ctx: StageContext) -> ExitCode:
    env = ctx.envelope
    w = env.spec.workload
    if not isinstance(w, VideoGenerate):
        raise ValidationFailed("the finalize stage needs a video.generate workload")
    # round trips that do not wait on each other go side by side on these threads (reads, the keys, the uploads):
    # the stage's own ordering is unchanged (nothing is written before the epoch check and the verdict, the result
    # file after the video and manifest it names)
    with ThreadPoolExecutor(2, thread_name_prefix="finalize-io") as pool:
        return _run(ctx, env, w, pool)


def _recorded(ctx: StageContext, bucket: str, key: str) -> dict | None:
    """The result file an earlier try wrote, if any."""
    try:
        return json.loads(ctx.objects.get_bytes(bucket, key))
    except NotFound:
        return None


def _run(ctx: StageContext, env, w: VideoGenerate, pool: ThreadPoolExecutor) -> ExitCode:
    bucket = env.s3.bucket_outputs
    result_key = f"{env.s3.output_prefix}finalize.json"
    recorded = pool.submit(_recorded, ctx, bucket, result_key)  # read beside the job item
    item = ctx.job.check_current()
    ref = item.get("generated")
    if not ref:
        raise Conflict(f"job {env.job_id} has no persisted inference output to finalize")
    previous = recorded.result()
    if previous and previous.get("source_sha256") == ref["sha256"] and (
        previous.get("blocked") or ctx.objects.exists(bucket, previous["video_key"])
    ):
        ctx.log.info("finalize already done for %s; returning the recorded result", ref["key"])
        if previous.get("blocked"):
            quarantine(ctx, bucket, ref["key"])
        return _done(ctx, previous)

    data = ctx.objects.get_bytes(bucket, ref["key"])
    if sha256_hex(data) != ref["sha256"]:
        raise TransientError(f"persisted inference output {ref['key']} does not match its hash")
    frames_f, meta = unpack_output(data)
    width, height = video.delivery_size(w.width, w.height, watermark.MIN_SIDE)
    frames = video.resize(video.to_uint8(frames_f), width, height)

    safety = frozen_safety(item)
    # the signing and watermark keys are read (Secrets Manager round trips, key parsing) while the frames are
    # moderated; they are used only once the verdict clears the clip, and a key that cannot be read fails the stage
    # then, as before, never a blocked clip's. With finalize_overlap, the watermarked MP4 is made on the same
    # thread meanwhile (CPU beside moderation's): used once the verdict clears the clip, dropped unfinished if
    # it blocks it; signing, the uploads and every write still wait for the verdict
    bits = watermark.payload_for_job(env.job_id)
    fps = int(meta.get("fps", 8))
    blocked = threading.Event()

    def prepare() -> tuple[keys.SigningCredentials, watermark.WatermarkKey, bytes | None]:
        creds, wm_key = credentials(ctx), watermark_key(ctx)
        if not ctx.settings.finalize_overlap or blocked.is_set():
            return creds, wm_key, None
        marked = watermark.embed(frames, bits, wm_key)
        return creds, wm_key, None if blocked.is_set() else video.encode_mp4(marked, fps=fps)

    prepared = pool.submit(prepare)
    verdict = safety.moderator(ctx.settings.moderation_backend, ctx.settings.torch_threads).moderate(frames)
    ctx.log.info("moderation (%s, profile v%d): blocked=%s scores=%s thresholds=%s", verdict.backend,
                 safety.profile_version, verdict.blocked, verdict.scores, verdict.thresholds)
    moderation = {**verdict.as_dict(), "profile_version": safety.profile_version}
    result: dict = {"source_sha256": ref["sha256"], "moderation": moderation, "blocked": verdict.blocked}
    if verdict.blocked:
        blocked.set()  # the MP4 in the making is not needed: its thread stops at its next step
    else:
        creds, wm_key, mp4 = prepared.result()  # a deployment without a usable key fails here, before any write
        payload = watermark.bits_to_hex(bits)
        if mp4 is None:
            mp4 = video.encode_mp4(watermark.embed(frames, bits, wm_key), fps=fps)
        definition = manifest.build_manifest(job_id=env.job_id, model=meta.get("model", w.model),
                                             model_hash=meta.get("model_hash", ""),
                                             prompt_sha256=meta.get("prompt_sha256", ""), watermark_payload=payload,
                                             watermark_key_id=wm_key.key_id)
        signed, store = manifest.sign_mp4(mp4, definition, creds, ctx.settings.tsa_url)
        video_key, manifest_key = f"{env.s3.output_prefix}video.mp4", f"{env.s3.output_prefix}video.c2pa"
        uploads = (pool.submit(ctx.objects.put_bytes, bucket, video_key, signed,
                               metadata={"sha256": sha256_hex(signed)}, content_type="video/mp4"),
                   pool.submit(ctx.objects.put_bytes, bucket, manifest_key, store, content_type="application/c2pa"))
        for upload in uploads:
            upload.result()
        result.update(video_key=video_key, manifest_key=manifest_key, watermark_payload=payload,
                      watermark_key_id=wm_key.key_id, video_sha256=sha256_hex(signed), width=width, height=height, frames=int(len(frames)))
        ctx.log.info("delivered %s (%d bytes, watermark %s)", video_key, len(signed), payload)
    ctx.objects.put_bytes(bucket, result_key, json.dumps(result, sort_keys=True).encode(),
                          content_type="application/json")
    if verdict.blocked:  # after the verdict is recorded: a retry returns it and finishes the move
        quarantine(ctx, bucket, ref["key"])
    return _done(ctx, result)


def _done(ctx: StageContext, result: dict) -> ExitCode:
    moderation = dict(result["moderation"])
    if moderation.get("blocked"):
        moderation["reason"] = f"{moderation['backend']}: {moderation['category']}"
    output = None
    if not result["blocked"]:
        output = {k: result[k] for k in ("video_key", "manifest_key", "watermark_payload")}
        output.update({k: result[k] for k in ("watermark_key_id", "video_sha256") if result.get(k)})
    ctx.job.set_finalized(moderation, output)
    ctx.result.update(result)
    return ExitCode.SUCCEEDED
