"""Finalize on moto: moderation → watermark → MP4 → C2PA → upload, verified end to end.

Generation runs in-process through the runtime entrypoint (tiny Wan at 32 px,
upscaled to 256 px by finalize); verification uses the real keyed watermark
detector (with the development key) and c2pa-python.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.provenance import verify
from gpufleet.provenance.keys import dev_credentials, dev_watermark_keys
from gpufleet.provenance.video import decode_mp4
from gpufleet.provenance.watermark import WatermarkKey, payload_hex
from gpufleet.runtime.generate import pack_output
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.objectstore import sha256_hex

pytestmark = pytest.mark.xdist_group("runtime-torch")


@pytest.fixture
def settings(tmp_path, tiny_cache):
    return RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tiny_cache), checkpoint_every_steps=2,
                           progress_interval_s=0, log_flush_s=0, tiny_generate_side=32, torch_threads=1,
                           dev_mode=True)


def _run(aws, envelope, settings):
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_generate_then_finalize_delivers_a_trusted_watermarked_video(aws, settings, rt, tmp_path):
    spec = rt.video_spec(steps=4)
    aws.put_job("job_fin", 1, spec)
    code, result = _run(aws, aws.envelope("job_fin", 1, spec), settings)
    assert code == ExitCode.SUCCEEDED, result
    assert aws.job("job_fin")["generated"] == result["generated"]

    code, result = _run(aws, aws.envelope("job_fin", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SUCCEEDED, result
    assert result["blocked"] is False and result["watermark_payload"] == payload_hex("job_fin")
    item = aws.job("job_fin")
    assert item["output"] == {"video_key": "jobs/job_fin/video.mp4", "manifest_key": "jobs/job_fin/video.c2pa",
                              "watermark_payload": payload_hex("job_fin"),
                              "watermark_key_id": dev_watermark_keys(settings.state_dir)[0].key_id,
                              "video_sha256": result["video_sha256"]}
    assert item["moderation"]["blocked"] is False
    video = aws.get("bucket_outputs", result["video_key"])
    assert aws.get("bucket_outputs", result["manifest_key"])  # the manifest store, uploaded alongside

    anchor = dev_credentials(settings.state_dir).trust_anchor_pem
    path = tmp_path / "video.mp4"
    path.write_bytes(video)
    wm_keys = dev_watermark_keys(settings.state_dir)
    good = verify(path, anchor, wm_keys)
    assert good.c2pa_state == "Trusted"
    assert good.job_id == "job_fin"
    assert good.watermark_payload == payload_hex("job_fin") and good.watermark_key_id == wm_keys[0].key_id
    job_assertion = [a for a in good.manifest["assertions"] if a["label"] == "org.gpufleet.job"][0]
    assert job_assertion["data"]["watermark"]["key_id"] == wm_keys[0].key_id
    # Another platform's key finds nothing: the mark exists only under the secret it was made with.
    other = verify(path, anchor, (WatermarkKey(b"\x07" * 32),))
    assert other.watermark_payload is None and other.watermark_checked
    actions = [a for a in good.manifest["assertions"] if a["label"].startswith("c2pa.actions")][0]
    created = actions["data"]["actions"][0]
    assert created["action"] == "c2pa.created"
    assert created["digitalSourceType"].endswith("trainedAlgorithmicMedia")
    assert created["parameters"]["job_id"] == "job_fin" and created["parameters"]["model"] == "wan-tiny"
    assert good.manifest["claim_generator_info"][0]["name"] == "gpufleet"

    # Without the dev trust anchor the signature is intact but not trusted.
    assert verify(path, None).c2pa_state == "Valid"

    flipped = bytearray(video)
    flipped[len(flipped) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    assert verify(path, anchor).c2pa_state == "Invalid"


def test_finalize_is_idempotent_and_reads_only_the_persisted_output(aws, settings, rt):
    spec = rt.video_spec()
    frames = np.full((5, 32, 32, 3), 0.35, dtype=np.float32)
    frames[:, :, :, 2] = 0.8  # blue-ish: no skin tones
    data = pack_output(frames, {"model": "wan-tiny", "model_hash": "m", "prompt_sha256": "p", "fps": 8})
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key="jobs/job_idem/generated/e0001.npz", Body=data)
    aws.put_job("job_idem", 1, spec,
                generated={"key": "jobs/job_idem/generated/e0001.npz", "sha256": sha256_hex(data)})
    env = aws.envelope("job_idem", 1, spec, stage="finalize")
    code, first = _run(aws, env, settings)
    assert code == ExitCode.SUCCEEDED and first["blocked"] is False
    etag = aws.s3.head_object(Bucket=rt.BUCKETS["bucket_outputs"], Key=first["video_key"])["ETag"]
    code, second = _run(aws, env, settings)
    assert code == ExitCode.SUCCEEDED
    assert second["video_sha256"] == first["video_sha256"]
    assert aws.s3.head_object(Bucket=rt.BUCKETS["bucket_outputs"], Key=first["video_key"])["ETag"] == etag


def test_the_overlapped_finalize_delivers_the_frames_one_after_the_other_would(aws, settings, rt):
    """finalize_overlap makes the watermarked MP4 while moderation runs: the delivered frames are the same bytes as
    the serial order's (the clip finalized again without the overlap: the recorded result removed, so it redoes it)."""
    spec = rt.video_spec()
    frames = np.random.default_rng(7).random((5, 32, 32, 3), dtype=np.float32) * 0.3 + 0.5
    frames[:, :, :, 2] = 0.9  # blue-ish: no skin tones, nothing blocks it
    data = pack_output(frames, {"model": "wan-tiny", "model_hash": "m", "prompt_sha256": "p", "fps": 8})
    bucket = rt.BUCKETS["bucket_outputs"]
    aws.s3.put_object(Bucket=bucket, Key="jobs/job_ovl/generated/e0001.npz", Body=data)
    aws.put_job("job_ovl", 1, spec, generated={"key": "jobs/job_ovl/generated/e0001.npz", "sha256": sha256_hex(data)})
    env = aws.envelope("job_ovl", 1, spec, stage="finalize")
    delivered = {}
    for overlap in (True, False):
        aws.s3.delete_object(Bucket=bucket, Key="jobs/job_ovl/finalize.json")
        code, result = _run(aws, env, settings.model_copy(update={"finalize_overlap": overlap}))
        assert code == ExitCode.SUCCEEDED and result["blocked"] is False
        delivered[overlap] = decode_mp4(aws.get("bucket_outputs", result["video_key"]))
    assert delivered[True].shape == (5, 256, 256, 3) and np.array_equal(delivered[True], delivered[False])


@pytest.mark.parametrize("overlap", [True, False])
def test_blocked_output_is_never_delivered_and_its_raw_frames_are_quarantined(aws, settings, rt, overlap):
    settings = settings.model_copy(update={"finalize_overlap": overlap})
    spec = rt.video_spec()
    bucket, raw = rt.BUCKETS["bucket_outputs"], "jobs/job_blk/generated/e0001.npz"
    aws.s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})  # as deployed
    gore = np.empty((5, 32, 32, 3), dtype=np.float32)
    gore[...] = np.array([120, 8, 12], dtype=np.float32) / 255.0  # blood red over the whole frame
    data = pack_output(gore, {"model": "wan-tiny", "fps": 8})
    aws.s3.put_object(Bucket=bucket, Key=raw, Body=data)
    aws.put_job("job_blk", 1, spec, generated={"key": raw, "sha256": sha256_hex(data)})
    env = aws.envelope("job_blk", 1, spec, stage="finalize")
    code, result = _run(aws, env, settings)
    assert code == ExitCode.SUCCEEDED
    assert result["blocked"] is True and result["moderation"]["category"] == "graphic_violence"
    assert aws.keys("bucket_outputs", "jobs/job_blk/") == ["jobs/job_blk/finalize.json"]
    item = aws.job("job_blk")
    assert item["moderation"]["blocked"] is True and item["moderation"]["reason"] == "standard: graphic_violence"
    assert "output" not in item
    # the raw frames left jobs/ for good (no version to read back) and wait under quarantine/ for review
    assert aws.s3.list_object_versions(Bucket=bucket, Prefix=raw).get("Versions", []) == []
    assert aws.get("bucket_outputs", f"quarantine/{raw}") == data

    # a try that recorded the verdict and died before the move: the retry returns the verdict and moves them
    aws.s3.put_object(Bucket=bucket, Key=raw, Body=data)
    code, again = _run(aws, env, settings)
    assert code == ExitCode.SUCCEEDED and again["blocked"] is True
    assert aws.s3.list_object_versions(Bucket=bucket, Prefix=raw).get("Versions", []) == []
    # and once moved, a retry finds nothing to move and still succeeds
    code, _ = _run(aws, env, settings)
    assert code == ExitCode.SUCCEEDED and aws.get("bucket_outputs", f"quarantine/{raw}") == data


def test_finalize_without_inference_output_or_with_a_tampered_one_is_a_system_error(aws, settings, rt):
    spec = rt.video_spec()
    aws.put_job("job_none", 1, spec)
    code, _ = _run(aws, aws.envelope("job_none", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SYSTEM_ERROR
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key="jobs/job_bad/generated/e0001.npz", Body=b"xx")
    aws.put_job("job_bad", 1, spec, generated={"key": "jobs/job_bad/generated/e0001.npz", "sha256": "0" * 64})
    code, _ = _run(aws, aws.envelope("job_bad", 1, spec, stage="finalize"), settings)
    assert code == ExitCode.SYSTEM_ERROR
    assert not {"moderation", "output"} & set(aws.job("job_bad"))
