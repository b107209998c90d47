"""C2PA signing: the manifest names the watermark key id; a configured time-stamp authority is asked."""

from __future__ import annotations

import pytest

from gpufleet.errors import ConfigError
from gpufleet.provenance import keys, manifest, robustness, video


@pytest.fixture(scope="module")
def signing(tmp_path_factory):
    creds = keys.dev_credentials(tmp_path_factory.mktemp("prov"))
    doc = manifest.build_manifest(job_id="job_m", model="m", model_hash="h", prompt_sha256="p",
                                  watermark_payload="0123456789ab", watermark_key_id="00112233aabbccdd")
    return creds, doc, video.encode_mp4(robustness.generated_clip(2, 256))


def test_the_manifest_names_the_watermark_method_payload_and_key_id(signing):
    _, doc, _ = signing
    job = [a for a in doc["assertions"] if a["label"] == "org.gpufleet.job"][0]["data"]["watermark"]
    assert job == {"method": "gpufleet-keyed-ss-v1", "bits": 48, "payload": "0123456789ab",
                   "key_id": "00112233aabbccdd"}


def test_signing_asks_the_configured_time_stamp_authority(signing):
    creds, doc, mp4 = signing
    signed, store = manifest.sign_mp4(mp4, doc, creds)  # no TSA: signed, untimestamped
    assert signed and store
    with pytest.raises(ConfigError, match="127.0.0.1:9"):  # nothing listens there: the request is made, fails
        manifest.sign_mp4(mp4, doc, creds, tsa_url="http://127.0.0.1:9/tsa")
