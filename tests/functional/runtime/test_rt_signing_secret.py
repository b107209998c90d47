"""Production C2PA signing on moto: finalize signs with the key and chain of the Secrets Manager secret the
template provisions (GPUFLEET_SIGNING_SECRET_ID) and watermarks under the key of its watermark secret
(GPUFLEET_WATERMARK_SECRET_ID), and outside dev mode a missing or unusable key fails the stage as a system error —
never a silent development key (a container's own watermark key would stamp videos no lookup can read)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import boto3
import numpy as np
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.provenance import verify
from gpufleet.provenance.keys import (
    SigningCredentials,
    _generate,
    credentials_to_secret,
    dev_credentials,
    watermark_keys_from_secret,
    watermark_keys_to_secret,
)
from gpufleet.provenance.watermark import WatermarkKey
from gpufleet.runtime.generate import pack_output
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.objectstore import sha256_hex

pytestmark = pytest.mark.xdist_group("runtime-torch")

SECRET = "gpufleet-c2pa-signing"
WM_SECRET = "gpufleet-watermark"


def _settings(tmp_path: Path, **kw) -> RuntimeSettings:
    return RuntimeSettings(state_dir=str(tmp_path / "state"), progress_interval_s=0, log_flush_s=0, **kw)


def _job(aws, rt, job_id: str) -> dict:
    spec = rt.video_spec()
    frames = np.full((5, 32, 32, 3), 0.35, dtype=np.float32)
    frames[:, :, :, 2] = 0.8  # blue-ish: no skin tones, never blocked
    data = pack_output(frames, {"model": "wan-tiny", "model_hash": "m", "prompt_sha256": "p", "fps": 8})
    key = f"jobs/{job_id}/generated/e0001.npz"
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_outputs"], Key=key, Body=data)
    aws.put_job(job_id, 1, spec, generated={"key": key, "sha256": sha256_hex(data)})
    return aws.envelope(job_id, 1, spec, stage="finalize")


def _run(aws, envelope, settings) -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb,
                secretsmanager=boto3.client("secretsmanager"), stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_outside_dev_mode_finalize_without_a_key_fails_loudly_and_uploads_nothing(aws, rt, tmp_path):
    settings = _settings(tmp_path)
    assert settings.dev_mode is False  # the default: production
    code, result = _run(aws, _job(aws, rt, "job_nokey"), settings)
    assert code == ExitCode.SYSTEM_ERROR
    assert "no C2PA signing key configured" in result["detail"]
    assert aws.keys("bucket_outputs", "jobs/job_nokey/") == ["jobs/job_nokey/generated/e0001.npz"]
    assert "output" not in aws.job("job_nokey")
    assert not (tmp_path / "state" / "provenance" / "signer.key.pem").exists()  # no development key was made


def test_finalize_signs_with_the_provisioned_secret(aws, rt, tmp_path):
    key_pem, chain_pem, anchor_pem = _generate()  # stands in for the operator's CA-issued signer
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name=SECRET, SecretString="placeholder-from-the-template")["ARN"]
    settings = _settings(tmp_path, signing_secret_id=arn)

    # the template's generated placeholder is not a key: a system error naming the secret
    code, result = _run(aws, _job(aws, rt, "job_placeholder"), settings)
    assert code == ExitCode.SYSTEM_ERROR and arn in result["detail"] and "not JSON" in result["detail"]

    sm.put_secret_value(SecretId=arn, SecretString=credentials_to_secret(SigningCredentials(key_pem, chain_pem)))
    # a usable signing key but no watermark key: a system error too, and no key of the container's own
    code, result = _run(aws, _job(aws, rt, "job_no_wm"), settings)
    assert code == ExitCode.SYSTEM_ERROR and "no watermark key configured" in result["detail"], result
    assert not (tmp_path / "state" / "provenance" / "watermark.keys").exists()

    # the template generates {"seed": ...}; every finalize container derives the same key from it
    wm_arn = sm.create_secret(Name=WM_SECRET, SecretString=json.dumps({"seed": "S" * 64}))["ARN"]
    (wm_key,) = watermark_keys_from_secret(json.dumps({"seed": "S" * 64}), WM_SECRET)
    settings = _settings(tmp_path, signing_secret_id=arn, watermark_secret_id=wm_arn)
    code, result = _run(aws, _job(aws, rt, "job_signed"), settings)
    assert code == ExitCode.SUCCEEDED, result
    assert result["watermark_key_id"] == wm_key.key_id
    assert not (tmp_path / "state" / "provenance" / "watermark.keys").exists()
    video = tmp_path / "video.mp4"
    video.write_bytes(aws.get("bucket_outputs", result["video_key"]))
    # the manifest's certificate chains to the provisioned anchor, and not to a development one
    assert verify(video, anchor_pem.decode()).c2pa_state == "Trusted"
    other = dev_credentials(tmp_path / "elsewhere").trust_anchor_pem.decode()
    assert verify(video, other).c2pa_state != "Trusted"
    assert not (tmp_path / "state" / "provenance" / "signer.key.pem").exists()


def test_a_secret_that_cannot_be_read_or_does_not_match_is_a_system_error(aws, rt, tmp_path):
    code, result = _run(aws, _job(aws, rt, "job_missing"), _settings(tmp_path, signing_secret_id="no-such-secret"))
    assert code == ExitCode.SYSTEM_ERROR and "no-such-secret" in result["detail"]

    key_pem, _, _ = _generate()
    _, other_chain, _ = _generate()
    sm = boto3.client("secretsmanager")
    sm.create_secret(Name=SECRET, SecretString=json.dumps({"private_key_pem": key_pem.decode(),
                                                           "chain_pem": other_chain.decode()}))
    code, result = _run(aws, _job(aws, rt, "job_mismatch"), _settings(tmp_path, signing_secret_id=SECRET))
    assert code == ExitCode.SYSTEM_ERROR and "not the key's" in result["detail"]


def test_a_rotated_watermark_secret_embeds_with_its_first_key_and_a_placeholder_is_a_system_error(aws, rt, tmp_path):
    key_pem, chain_pem, _ = _generate()
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name=SECRET, SecretString=credentials_to_secret(SigningCredentials(key_pem, chain_pem)))["ARN"]
    wm_arn = sm.create_secret(Name=WM_SECRET, SecretString="not-json")["ARN"]
    settings = _settings(tmp_path, signing_secret_id=arn, watermark_secret_id=wm_arn)
    code, result = _run(aws, _job(aws, rt, "job_wm_bad"), settings)
    assert code == ExitCode.SYSTEM_ERROR and WM_SECRET in result["detail"] and "not JSON" in result["detail"]

    new, old = WatermarkKey(b"\x11" * 32), WatermarkKey(b"\x22" * 32)
    sm.put_secret_value(SecretId=wm_arn, SecretString=watermark_keys_to_secret((new, old)))
    code, result = _run(aws, _job(aws, rt, "job_wm_rotated"), settings)
    assert code == ExitCode.SUCCEEDED, result
    assert result["watermark_key_id"] == new.key_id != old.key_id
