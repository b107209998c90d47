"""Standard Webhooks signing, event filter and retry schedule (pure)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.errors import Unauthorized, ValidationFailed
from gpufleet.jobrecord import JobRecord
from gpufleet.spec import JobSpec
from gpufleet.webhooks import events, signing

SECRET = signing.new_secret(b"k" * 32)


def test_signature_matches_reference_construction():
    body = b'{"type":"job.completed"}'
    expected = base64.b64encode(hmac.new(b"k" * 32, b"msg_1.1700000000." + body, hashlib.sha256).digest()).decode()
    assert signing.signature(SECRET, "msg_1", 1700000000, body) == "v1," + expected


@given(body=st.binary(max_size=256), msg_id=st.text("abcdef0123456789_", min_size=1, max_size=30))
def test_sign_then_verify_roundtrip(body, msg_id):
    hdrs = signing.headers(SECRET, msg_id, 1700000000, body)
    signing.verify(SECRET, hdrs, body, now=1700000010)


def test_verify_rejects_tampering_replay_and_wrong_secret():
    body = b"{}"
    hdrs = signing.headers(SECRET, "msg_1", 1700000000, body)
    with pytest.raises(Unauthorized):
        signing.verify(SECRET, hdrs, b"{ }", now=1700000000)
    with pytest.raises(Unauthorized):
        signing.verify(SECRET, hdrs, body, now=1700000000 + 301)
    with pytest.raises(Unauthorized):
        signing.verify(signing.new_secret(b"z" * 32), hdrs, body, now=1700000000)
    with pytest.raises(Unauthorized):
        signing.verify(SECRET, {"webhook-id": "msg_1"}, body, now=1700000000)


def test_verify_accepts_any_of_several_signatures():
    body = b"{}"
    hdrs = signing.headers(SECRET, "msg_1", 1700000000, body)
    hdrs["webhook-signature"] = "v1,bogus " + hdrs["webhook-signature"]
    signing.verify(SECRET, hdrs, body, now=1700000000)


def test_secret_format_validated():
    with pytest.raises(ValidationFailed):
        signing.signature("nope", "m", 1, b"")
    with pytest.raises(ValidationFailed):
        signing.new_secret(b"short")


WORKLOAD = {"kind": "video.generate", "prompt": "a cat"}


def _spec(**fields) -> JobSpec:
    return JobSpec.model_validate({"workload": WORKLOAD, **fields})


def test_event_filter():
    spec = _spec(webhook={"url": "https://example.com/h", "events": ["started", "completed"]})
    assert events.wanted(spec, "completed") == "https://example.com/h"
    assert events.wanted(spec, "progress") is None
    # events default to ["completed"]; the URL is the spec's, normalized as the API stores it
    assert events.wanted(_spec(webhook={"url": "https://e.com"}), "completed") == "https://e.com/"
    assert events.wanted(_spec(), "completed") is None
    with pytest.raises(ValueError):
        events.wanted(spec, "finished")


def test_event_body_hides_watermark_payload_and_ids_are_stable():
    job = JobRecord.from_item({
        "job_id": "job_1", "tenant": "t", "team": "a", "user": "u", "status": "SUCCEEDED", "priority": 100,
        "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z",
        "spec": {"workload": WORKLOAD, "webhook": {"url": "https://e.com"}},
        "output": {"video_key": "v", "manifest_key": "m", "watermark_payload": "secret"}})
    a = events.build(job, "completed", "2026-01-01T00:00:00.000Z")
    b = events.build(job, "completed", "2026-01-01T00:00:09.000Z")
    assert a["msg_id"] == b["msg_id"]
    assert "watermark_payload" not in json.loads(a["body"])["data"]["output"]


def test_retry_schedule_spans_hours_and_ends():
    delays = [events.retry_delay(n) for n in range(1, len(events.RETRY_SCHEDULE_S) + 1)]
    assert delays == sorted(delays) and sum(delays) > 24 * 3600
    assert all(d <= events.MAX_VISIBILITY_S for d in delays)
    assert events.retry_delay(len(events.RETRY_SCHEDULE_S) + 1) is None


def test_started_and_progress_derived_from_job_changes():
    old = {"sk": "META", "status": "SCHEDULED", "current_epoch": 2}
    new = {"sk": "META", "status": "RUNNING", "current_epoch": 2, "progress": {"step": 1, "total": 4}}
    assert events.from_change(old, new) == [("started", "e2"), ("progress", "e2:s1")]
    again = {**new, "progress": {"step": 1, "total": 4}}
    assert events.from_change(new, again) == []
    assert events.from_change(None, {"sk": "EVENT#x", "status": "RUNNING"}) == []
