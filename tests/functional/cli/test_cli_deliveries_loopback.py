"""``Client.deliveries`` and ``gpufleet deliveries`` against the scripted SigV4-verifying loopback API:
route, signing, retries, documented field names, exit codes and one-line errors."""

from __future__ import annotations

import json

import pytest
from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY

from gpufleet import errors
from gpufleet.cli.main import main
from gpufleet.profile import Profile, write_profile

TRY_1 = {
    "msg_id": "msg_1",
    "event_type": "job.completed",
    "url": "https://hooks.example.com/x",
    "attempt": 1,
    "status_code": 0,
    "delivered": False,
    "at": "2026-11-30T05:00:00.000Z",
    "next_retry_at": "2026-11-30T05:00:05.000Z",
    "dead_lettered": False,
}
TRY_2 = {**TRY_1, "attempt": 2, "status_code": 200, "delivered": True, "at": "2026-11-30T05:00:05.000Z"}
del TRY_2["next_retry_at"]


def problem(slug: str, status: int, detail: str) -> dict:
    return {"type": f"https://gpufleet.dev/problems/{slug}", "title": slug, "status": status, "detail": detail}


def test_sdk_reads_the_route_signed_and_retries_with_retry_after(loopback, client_for, sleeps):
    loopback.script = [
        (503, {"Retry-After": "2"}, problem("unavailable", 503, "busy")),
        (200, {}, {"job_id": "job_01", "deliveries": [TRY_1, TRY_2]}),
    ]
    got = client_for(loopback).deliveries("job_01")
    assert [(d.attempt, d.status_code, d.delivered) for d in got] == [(1, 0, False), (2, 200, True)]
    assert got[0].next_retry_at == "2026-11-30T05:00:05.000Z" and got[1].next_retry_at is None
    assert [(s.method, s.path) for s in loopback.seen] == [("GET", "/v1/jobs/job_01/webhooks")] * 2
    assert all(s.signature_ok for s in loopback.seen)
    assert sleeps.calls == [2.0]


def test_sdk_accepts_the_documented_field_names(loopback, client_for):
    documented = {
        "delivery_id": "d1",
        "event": "job.started",
        "attempt": 3,
        "status_code": 410,
        "ok": False,
        "ts": "2026-11-30T06:00:00.000Z",
        "error": "gone",
    }
    loopback.script = [(200, {}, {"job_id": "job_01", "deliveries": [documented]})]
    (d,) = client_for(loopback).deliveries("job_01")
    assert (d.at, d.event_type, d.delivered, d.error) == ("2026-11-30T06:00:00.000Z", "job.started", False, "gone")
    assert d.model_extra == {"delivery_id": "d1"}


def test_sdk_not_found_is_raised_without_retrying(loopback, client_for, sleeps):
    loopback.script = [(404, {}, problem("not-found", 404, "job job_x not found"))]
    with pytest.raises(errors.NotFound, match="job job_x not found"):
        client_for(loopback).deliveries("job_x")
    assert len(loopback.seen) == 1 and sleeps.calls == []


@pytest.fixture
def profile_file(loopback, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    path = write_profile(
        Profile(endpoint=loopback.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY),
        tmp_path / "profile.json",
    )
    monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
    return path


def test_cli_table_json_and_empty(loopback, profile_file, capsys):
    loopback.script = [
        (200, {}, {"job_id": "job_01", "deliveries": [TRY_1, TRY_2]}),
        (200, {}, {"job_id": "job_01", "deliveries": [TRY_1, TRY_2]}),
        (200, {}, {"job_id": "job_02", "deliveries": []}),
    ]
    assert main(["deliveries", "job_01"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "TIME                      EVENT          ATTEMPT  STATUS       DELIVERED  NEXT RETRY",
        "2026-11-30T05:00:00.000Z  job.completed  1        no response  no         2026-11-30T05:00:05.000Z",
        "2026-11-30T05:00:05.000Z  job.completed  2        200          yes",
    ]
    assert main(["deliveries", "job_01", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["attempt"] for d in doc] == [1, 2] and doc[0]["msg_id"] == "msg_1"
    assert main(["deliveries", "job_02"]) == 0
    assert capsys.readouterr().out == "no webhook deliveries\n"


@pytest.mark.parametrize(
    ("status", "slug", "code"),
    [(404, "not-found", 1), (403, "unauthorized", 1), (500, "internal", 2)],
)
def test_cli_errors_are_one_line_with_exit_code(loopback, profile_file, capsys, status, slug, code):
    loopback.handler = lambda seen: (status, {"Retry-After": "0"}, problem(slug, status, f"job_9 says {slug}"))
    assert main(["deliveries", "job_9", "--json"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"gpufleet: error: job_9 says {slug}\n"
