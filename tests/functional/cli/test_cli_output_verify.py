"""``gpufleet output``: download from presigned links, then verify C2PA and the watermark.

The video is made with the real provenance code (watermark, H.264, C2PA signed with development
credentials) and served by the loopback server as a presigned download would be.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet.cli.main import main
from gpufleet.cli.output import bits_matching, verification_report
from gpufleet.profile import Profile, write_profile

JOB = "job_01jdverifyoutputtest000000"


@pytest.fixture(scope="module")
def signed_video(tmp_path_factory):
    from gpufleet.provenance import keys, manifest, video, watermark

    state = tmp_path_factory.mktemp("prov")
    creds = keys.dev_credentials(state)
    keys.watermark_keys_path(state).parent.mkdir(parents=True, exist_ok=True)
    keys.watermark_keys_path(state).write_text("5e" * 32 + "\n")  # fixed: the same mark every run
    wm_key = keys.dev_watermark_keys(state)[0]
    rng = np.random.default_rng(0)
    base = rng.integers(40, 200, size=(1, 256, 256, 3), dtype=np.uint8)
    frames = np.repeat(base, 5, axis=0)
    marked = watermark.embed(frames, watermark.payload_for_job(JOB), wm_key)
    mp4 = video.encode_mp4(marked)
    doc = manifest.build_manifest(
        job_id=JOB,
        model="wan-tiny",
        model_hash="0" * 64,
        prompt_sha256="1" * 64,
        watermark_payload=watermark.payload_hex(JOB),
        watermark_key_id=wm_key.key_id,
    )
    signed, store = manifest.sign_mp4(mp4, doc, creds)
    return {"video": signed, "store": store, "anchor": state / "provenance" / "trust_anchor.pem",
            "wm_keys": keys.watermark_keys_path(state)}


@pytest.fixture
def serve(loopback, tmp_path, monkeypatch, signed_video):
    def setup(video_bytes: bytes, anchors=None, wm_keys=None):
        path = write_profile(
            Profile(
                endpoint=loopback.endpoint,
                region=REGION,
                access_key_id=ACCESS_KEY,
                secret_access_key=SECRET_KEY,
                trust_anchors=str(anchors) if anchors else None,
                watermark_keys=str(wm_keys) if wm_keys else None,
            ),
            tmp_path / "profile.json",
        )
        monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
        monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
        base = loopback.endpoint
        routes = {
            f"/v1/jobs/{JOB}/output": (
                200,
                {},
                {
                    "job_id": JOB,
                    "video_url": f"{base}/presigned/video.mp4?X-Amz-Signature=x",
                    "manifest_url": f"{base}/presigned/video.c2pa",
                    "expires_at": "t",
                },
            ),
            "/presigned/video.mp4?X-Amz-Signature=x": (200, {}, video_bytes),
            "/presigned/video.c2pa": (200, {}, signed_video["store"]),
        }
        loopback.handler = lambda seen: routes[seen.path]

    return setup


def test_output_downloads_and_verifies(serve, signed_video, tmp_path, capsys):
    serve(signed_video["video"], anchors=signed_video["anchor"], wm_keys=signed_video["wm_keys"])
    out_dir = tmp_path / "out"
    assert main(["output", JOB, "-o", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert (out_dir / f"{JOB}.mp4").read_bytes() == signed_video["video"]
    assert (out_dir / f"{JOB}.c2pa").read_bytes() == signed_video["store"]
    assert "C2PA:      Trusted  ok" in text and "watermark: " in text and "FAILED" not in text
    assert "not checked" not in text


def test_without_the_watermark_key_the_mark_is_not_checked(serve, signed_video, tmp_path, capsys):
    serve(signed_video["video"], anchors=signed_video["anchor"])
    assert main(["output", JOB, "-o", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["verification"]
    assert report["watermark_checked"] is False and report["watermark_payload"] is None


def test_a_wrong_watermark_key_fails_verification(serve, signed_video, tmp_path, capsys):
    wrong = tmp_path / "wrong.keys"
    wrong.write_text("07" * 32 + "\n")
    serve(signed_video["video"], anchors=signed_video["anchor"], wm_keys=wrong)
    assert main(["output", JOB, "-o", str(tmp_path)]) == 4
    assert "watermark not found" in capsys.readouterr().out


def test_output_json_and_a_flipped_byte_fails_verification(serve, signed_video, tmp_path, capsys):
    tampered = bytearray(signed_video["video"])
    tampered[len(tampered) // 2] ^= 0xFF
    serve(bytes(tampered), anchors=signed_video["anchor"])
    assert main(["output", JOB, "-o", str(tmp_path), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)["verification"]
    assert report["ok"] is False and report["c2pa_trusted"] is False
    assert any("C2PA manifest is" in p for p in report["problems"])


def test_without_trust_anchors_the_manifest_is_not_trusted(serve, signed_video, tmp_path, capsys):
    serve(signed_video["video"], anchors=None)
    assert main(["output", JOB, "-o", str(tmp_path)]) == 4
    out = capsys.readouterr().out
    assert "problem:   C2PA manifest is Valid (signer not among the trust anchors)" in out


def test_report_judges_watermark_bits():
    class R:
        c2pa_state, job_id, watermark_confidence, failures = "Trusted", JOB, 0.9, []
        watermark_payload = "ffffffffffff"

    assert bits_matching("ffffffffffff", "fffffffffff0") == 44
    assert verification_report(JOB, "fffffffffff0", R())["ok"] is True
    bad = verification_report(JOB, "ffffffffff00", R())
    assert bad["ok"] is False and bad["problems"] == ["watermark not found (40/48 bits match, need 44)"]
