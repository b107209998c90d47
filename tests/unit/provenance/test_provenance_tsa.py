"""The development RFC 3161 time-stamp authority: c2pa-python accepts and trusts its tokens."""

from __future__ import annotations

import io

import pytest

from gpufleet.provenance import keys, manifest, robustness, tsa, video


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    state = tmp_path_factory.mktemp("tsa")
    server = tsa.TsaServer(tsa.dev_tsa(state)).start()
    yield state, server
    server.stop()


def test_signatures_carry_a_trusted_time_stamp(authority):
    import c2pa

    state, server = authority
    creds = keys.dev_credentials(state)
    doc = manifest.build_manifest(job_id="job_t", model="m", model_hash="h", prompt_sha256="p",
                                  watermark_payload="0123456789ab", watermark_key_id="k")
    signed, _ = manifest.sign_mp4(video.encode_mp4(robustness.generated_clip(2, 256)), doc, creds, server.url)
    anchors = (creds.trust_anchor_pem + tsa.dev_tsa(state).root_pem).decode()
    ctx = c2pa.Context(c2pa.Settings.from_dict({"verify": {"verify_trust": True}, "trust": {"trust_anchors": anchors}}))
    reader = c2pa.Reader("video/mp4", io.BytesIO(signed), context=ctx)
    assert reader.get_validation_state() == "Trusted"
    codes = {s["code"] for s in reader.get_validation_results()["activeManifest"]["success"]}
    assert {"timeStamp.validated", "timeStamp.trusted"} <= codes


def test_the_authority_reuses_its_keys_and_rejects_garbage(authority):
    from asn1crypto import tsp

    state, _ = authority
    assert tsa.dev_tsa(state) == tsa.dev_tsa(state)
    assert (state / "provenance" / "tsa.key.pem").stat().st_mode & 0o777 == 0o600
    answer = tsa.dev_tsa(state).respond(b"not a request")  # SEQUENCE { PKIStatusInfo }, no token
    assert answer[0] == 0x30 and answer[1] == len(answer) - 2
    assert tsp.PKIStatusInfo.load(answer[2:])["status"].native == "rejection"
