"""The provenance lookup's own per-tenant bucket: a tenant that spends it gets 429 ``scope: lookup`` before any
detection, while its other routes and another tenant's lookups are served (a lookup runs the detector in the API
function, so one tenant's lookups must not take the concurrency every tenant's requests share)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from api_helpers import ALICE, CAROL

from gpufleet.provenance.watermark import WatermarkKey

KEY = WatermarkKey(b"\x42" * 32)
RATE, BURST = 0.5, 3


@pytest.fixture
def settings_kw(tmp_path):
    path = tmp_path / "watermark.keys"
    path.write_text(KEY.secret.hex() + "\n")
    return {"watermark_keys_file": str(path), "tenant_lookup_rate_limit": RATE, "tenant_lookup_burst_limit": BURST}


def _body() -> dict:
    plane = np.full((256, 256), 128, dtype=np.uint8)  # unmarked: the answer is found=false
    return {"width": 256, "height": 256, "luma_b64": base64.b64encode(plane.tobytes()).decode()}


def test_a_tenants_lookups_beyond_its_bucket_are_refused_before_detection(call, clock, monkeypatch):
    import gpufleet.provenance.watermark as wm

    detections = []
    real = wm.detect_luma
    monkeypatch.setattr(wm, "detect_luma", lambda *a, **k: detections.append(1) or real(*a, **k))
    for _ in range(BURST):
        r = call("POST", "/v1/provenance/lookup", _body(), arn=ALICE)
        assert r.status == 200 and r.json["found"] is False, r.text
    refused = call("POST", "/v1/provenance/lookup", _body(), arn=ALICE)
    assert refused.status == 429 and refused.json["type"].endswith("/rate-limited"), refused.text
    assert refused.json["scope"] == "lookup" and refused.json["limit_value"] == RATE
    assert int(refused.headers["retry-after"]) == 2  # one token every 1/RATE s
    assert len(detections) == BURST  # the refused lookup ran no detector
    assert call("GET", "/v1/jobs?limit=1", arn=ALICE).status == 200  # its other routes: its request bucket
    assert call("POST", "/v1/provenance/lookup", _body(), arn=CAROL).status == 200  # another tenant's lookups
    clock.advance(1 / RATE)
    assert call("POST", "/v1/provenance/lookup", _body(), arn=ALICE).status == 200  # refilled
