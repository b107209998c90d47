"""gpufleet.Client against a loopback server that verifies SigV4 itself.

Covers: signing, Idempotency-Key generated per submission and reused on retries, Retry-After
honoured, backoff, problem+json → gpufleet.errors, cursor iteration, wait() timeout, and
credentials from botocore's chain.
"""

from __future__ import annotations

import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet import errors
from gpufleet.profile import Profile
from gpufleet.sdk import Client
from gpufleet.sdk_retry import RetryPolicy
from gpufleet.status import JobStatus

SPEC = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}


def job(job_id: str = "job_01", status: str = "QUEUED", **kw) -> dict:
    return {"job_id": job_id, "status": status, "spec": SPEC, **kw}


def problem(slug: str, status: int, detail: str, **kw) -> dict:
    return {"type": f"https://gpufleet.dev/problems/{slug}", "title": slug, "status": status, "detail": detail, **kw}


def test_submit_is_signed_and_carries_a_fresh_idempotency_key(loopback, client_for):
    loopback.script = [(202, {}, job("job_a")), (202, {}, job("job_b"))]
    client = client_for(loopback)
    first = client.submit(SPEC)
    second = client.submit(SPEC)
    assert (first.job_id, first.status) == ("job_a", JobStatus.QUEUED)
    assert second.job_id == "job_b"
    assert all(s.signature_ok for s in loopback.seen)
    keys = [s.headers["Idempotency-Key"] for s in loopback.seen]
    assert keys[0] != keys[1] and all(len(k) >= 32 for k in keys)
    assert loopback.seen[0].json()["workload"]["prompt"] == SPEC["workload"]["prompt"]
    assert "idempotency-key" in loopback.seen[0].headers["Authorization"].lower()


def test_wrong_secret_is_detected_by_the_verifier(loopback, fake_clock, sleeps):
    """The loopback verifier really checks: a client signing with another secret fails it."""
    loopback.script = [(200, {}, job())]
    profile = Profile(endpoint=loopback.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key="wrong")
    Client(profile=profile, clock=fake_clock, sleep=sleeps).get("job_01")
    assert loopback.seen[0].signature_ok is False


def test_retry_reuses_the_key_and_honours_retry_after(loopback, client_for, sleeps):
    loopback.script = [
        (503, {"Retry-After": "3"}, problem("unavailable", 503, "busy")),
        (429, {"Retry-After": "7"}, problem("quota-exceeded", 429, "slow down")),
        (409, {}, problem("idempotency-in-flight", 409, "first request still running")),
        (202, {}, job("job_r")),
    ]
    result = client_for(loopback).submit(SPEC, idempotency_key="my-key-1")
    assert result.job_id == "job_r"
    assert [s.headers["Idempotency-Key"] for s in loopback.seen] == ["my-key-1"] * 4
    assert len({s.headers["X-Amz-Date"] + s.headers["Authorization"] for s in loopback.seen}) >= 1
    assert all(s.signature_ok for s in loopback.seen)
    # Retry-After wins; the third wait is jittered backoff: 0.2 * 2**2 * rand(0.5) = 0.4
    assert sleeps.calls == [3.0, 7.0, pytest.approx(0.4)]


def test_retry_after_as_http_date(loopback, client_for, sleeps, fake_clock):
    from email.utils import formatdate

    when = formatdate(fake_clock.now() + 5, usegmt=True)
    loopback.script = [(503, {"Retry-After": when}, problem("unavailable", 503, "x")), (200, {}, job())]
    client_for(loopback).get("job_01")
    assert sleeps.calls == [pytest.approx(5.0, abs=1.0)]


def test_a_long_retry_after_is_raised_not_waited(loopback, client_for, sleeps):
    loopback.script = [(429, {"Retry-After": "600"}, problem("quota-exceeded", 429, "user over queued-jobs limit"))]
    with pytest.raises(errors.QuotaExceeded) as info:
        client_for(loopback).submit(SPEC)
    assert info.value.retry_after == 600
    assert info.value.detail == "user over queued-jobs limit"
    assert sleeps.calls == [] and len(loopback.seen) == 1


def test_gives_up_after_max_attempts(loopback, client_for, sleeps):
    loopback.handler = lambda seen: (502, {}, {"message": "bad gateway"})
    with pytest.raises(errors.TransientError):
        client_for(loopback, retry=RetryPolicy(max_attempts=3)).get("job_01")
    assert len(loopback.seen) == 3
    assert sleeps.calls == [pytest.approx(0.1), pytest.approx(0.2)]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, problem("not-found", 404, "no such job"), errors.NotFound),
        (
            409,
            problem("invalid-transition", 409, "job is SUCCEEDED", current_status="SUCCEEDED"),
            errors.InvalidTransition,
        ),
        (422, problem("idempotency-mismatch", 422, "different payload"), errors.IdempotencyMismatch),
        (403, {"message": "Forbidden"}, errors.Unauthorized),
        (400, problem("validation", 400, "frames: must be 4k+1"), errors.ValidationFailed),
    ],
)
def test_problem_json_maps_to_error_types(loopback, client_for, sleeps, status, body, expected):
    loopback.script = [(status, {}, body)]
    with pytest.raises(expected) as info:
        client_for(loopback).get("job_01")
    assert info.value.status == status
    assert "\n" not in info.value.detail
    assert sleeps.calls == []  # none of these is retried
    if expected is errors.InvalidTransition:
        assert info.value.extra["current_status"] == "SUCCEEDED"


def test_connection_refused_becomes_transient_error(client_for, sleeps):
    from sdk_loopback import LoopbackServer

    server = LoopbackServer().start()
    client = client_for(server, retry=RetryPolicy(max_attempts=2))
    server.stop()
    with pytest.raises(errors.TransientError, match="cannot reach"):
        client.get("job_01")
    assert len(sleeps.calls) == 1


def test_iter_jobs_follows_the_cursor(loopback, client_for):
    pages = {
        None: {"jobs": [job("job_3"), job("job_2")], "next_cursor": "c1"},
        "c1": {"jobs": [job("job_1")], "next_cursor": None},
    }

    def handler(seen):
        from urllib.parse import parse_qs, urlsplit

        q = parse_qs(urlsplit(seen.path).query)
        assert q.get("status") == ["QUEUED"]
        return 200, {}, pages[q.get("cursor", [None])[0]]

    loopback.handler = handler
    ids = [j.job_id for j in client_for(loopback).iter_jobs(status="QUEUED", page_size=2)]
    assert ids == ["job_3", "job_2", "job_1"]
    assert all(s.signature_ok for s in loopback.seen)


def test_wait_reports_progress_and_times_out(loopback, client_for):
    states = iter([job(status="PENDING"), job(status="RUNNING", progress={"step": 3, "total": 10})])
    loopback.handler = lambda seen: (200, {}, next(states, job(status="RUNNING", progress={"step": 5, "total": 10})))
    seen_updates = []
    with pytest.raises(errors.WaitTimeout, match="still RUNNING"):
        client_for(loopback).wait("job_01", timeout=5, poll_s=1, on_update=seen_updates.append)
    assert seen_updates[0].status == JobStatus.PENDING
    assert seen_updates[1].progress.step == 3 and seen_updates[1].progress.fraction == 0.3


def test_wait_returns_the_terminal_job(loopback, client_for):
    states = iter([job(status="RUNNING"), job(status="SUCCEEDED", output={"video_key": "k"})])
    loopback.handler = lambda seen: (200, {}, next(states))
    done = client_for(loopback).wait("job_01", timeout=60)
    assert done.status == JobStatus.SUCCEEDED and done.is_terminal and done.output == {"video_key": "k"}


def test_local_spec_validation_gives_one_line(loopback, client_for):
    with pytest.raises(errors.ValidationFailed) as info:
        client_for(loopback).submit({"workload": {"kind": "video.generate", "prompt": "x", "frames": 8}})
    assert "frames must be of the form 4k+1" in info.value.detail and "\n" not in info.value.detail
    assert loopback.seen == []


def test_credentials_from_the_botocore_chain(loopback, monkeypatch, fake_clock, sleeps):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    loopback.script = [(200, {}, {"pools": [{"name": "onprem-a", "kind": "onprem", "max_gpus": 1}]})]
    pools = Client(loopback.endpoint, region=REGION, clock=fake_clock, sleep=sleeps).pools()
    assert pools[0].name == "onprem-a"
    assert loopback.seen[0].signature_ok


def test_cancel_events_logs_output(loopback, client_for):
    routes = {
        ("DELETE", "/v1/jobs/job_01"): (202, {}, job(status="PENDING", cancel_requested=True)),
        ("GET", "/v1/jobs/job_01/events"): (
            200,
            {},
            {"events": [{"ts": "t1", "type": "QUEUED"}, {"at": "t2", "status": "PENDING"}]},
        ),
        ("GET", "/v1/jobs/job_01/logs?after=5"): (200, {}, {"lines": [{"msg": "step 1/10"}], "next": "6"}),
        ("GET", "/v1/jobs/job_01/output"): (200, {}, {"video_url": "http://x/v.mp4", "manifest_url": "http://x/m"}),
    }
    loopback.handler = lambda seen: routes[(seen.method, seen.path)]
    client = client_for(loopback)
    assert client.cancel("job_01").cancel_requested is True
    events = client.events("job_01")
    assert [(e.ts, e.label) for e in events] == [("t1", "QUEUED"), ("t2", "PENDING")]
    page = client.logs("job_01", after="5")
    assert page.lines[0].msg == "step 1/10" and page.next == "6"
    assert client.output("job_01").video_url == "http://x/v.mp4"
