"""``gpufleet verify FILE``: the file's own C2PA state, then the platform's watermark lookup.

The loopback server plays the platform: it decodes the uploaded mean-luma plane and detects with the
real keyed detector, so the plane the CLI computes (and halves for large frames) is what is checked.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet.cli.main import main
from gpufleet.profile import Profile, write_profile
from gpufleet.provenance import keys, manifest, robustness, video, watermark
from gpufleet.provenance.watermark import WatermarkKey

JOB = "job_01jdverifycliprovenance000"
KEY = WatermarkKey(b"\x33" * 32)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    state = tmp_path_factory.mktemp("prov")
    creds = keys.dev_credentials(state)
    frames = robustness.generated_clip(5, 256)
    mp4 = video.encode_mp4(watermark.embed(frames, watermark.payload_for_job(JOB), KEY))
    doc = manifest.build_manifest(job_id=JOB, model="wan-tiny", model_hash="0" * 64, prompt_sha256="1" * 64,
                                  watermark_payload=watermark.payload_hex(JOB), watermark_key_id=KEY.key_id)
    video_bytes, store = manifest.sign_mp4(mp4, doc, creds)
    return {"video": video_bytes, "store": store, "anchor": state / "provenance" / "trust_anchor.pem"}


@pytest.fixture
def platform(loopback, tmp_path, monkeypatch, signed):
    path = write_profile(Profile(endpoint=loopback.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                                 secret_access_key=SECRET_KEY, trust_anchors=str(signed["anchor"])),
                         tmp_path / "profile.json")
    monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    base = loopback.endpoint
    planes = []

    def handle(seen):
        if seen.path == "/presigned/video.c2pa":
            return 200, {}, signed["store"]
        if seen.path == "/presigned/video.mp4":
            return 200, {}, signed["video"]
        body = seen.json()
        plane = np.frombuffer(base64.b64decode(body["luma_b64"]), np.uint8).reshape(body["height"], body["width"])
        planes.append(plane.shape)
        found = watermark.detect_luma(plane, [KEY])
        matches = [{"job_id": JOB, "published_at": "2026-12-02T00:00:00Z", "video_sha256": "ab" * 32, "own": True,
                    "manifest_url": f"{base}/presigned/video.c2pa", "video_url": f"{base}/presigned/video.mp4"}]
        return 200, {}, {"found": found.valid, "watermark_payload": found.hex if found.valid else None,
                         "watermark_key_id": found.key_id, "sync_z": found.sync_z, "scale": found.scale,
                         "flipped": found.flipped, "matches": matches if found.valid else [], "expires_at": "t"}

    loopback.handler = handle
    return planes


def test_a_remuxed_copy_without_its_manifest_is_matched_and_its_original_recovered(platform, signed, tmp_path,
                                                                                   capsys):
    stripped = tmp_path / "stripped.mp4"
    stripped.write_bytes(robustness.remux(signed["video"]))
    out = tmp_path / "found"
    assert main(["verify", str(stripped), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["c2pa_state"] == "None" and report["ok"] is True
    assert report["lookup"]["watermark_payload"] == watermark.payload_hex(JOB)
    assert report["originals"] == {JOB: "Trusted"}  # the kept original verifies against the anchors
    assert (out / f"{JOB}.c2pa").read_bytes() == signed["store"]


def test_a_flipped_jpeg_frame_is_matched(platform, signed, tmp_path, capsys):
    import cv2

    frame = robustness.flip(video.decode_mp4(signed["video"])[2:3])[0]
    path = tmp_path / "frame.jpg"
    cv2.imwrite(str(path), frame[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 50])
    assert main(["verify", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"match:     job {JOB}" in text and "mirrored" in text


def test_a_large_frame_is_halved_to_fit_the_upload(platform, tmp_path, capsys):
    big = np.repeat(np.repeat(robustness.generated_clip(1, 256), 8, axis=1), 8, axis=2)  # 2048×2048
    path = tmp_path / "big.png"
    import cv2

    cv2.imwrite(str(path), big[0])
    assert main(["verify", str(path)]) == 4  # unmarked: nothing found, no manifest
    assert platform == [(1024, 1024)]
    assert "none found by the platform" in capsys.readouterr().out


def test_a_missing_file_is_refused_before_any_request(platform, tmp_path, capsys):
    assert main(["verify", str(tmp_path / "absent.mp4")]) != 0
    assert "absent.mp4: no such file" in capsys.readouterr().err
    assert platform == []  # no lookup was sent


def test_a_file_that_is_not_a_video_is_refused_without_a_lookup(platform, tmp_path, capsys):
    junk = tmp_path / "notes.mp4"
    junk.write_bytes(b"not a video at all")
    assert main(["verify", str(junk)]) != 0
    assert "cannot read frames" in capsys.readouterr().err
    assert platform == []
