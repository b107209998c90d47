"""Pure parts of the SDK: retry policy, Retry-After parsing, problem mapping, profile resolution."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet import errors
from gpufleet.profile import Profile, load_profile, write_profile
from gpufleet.sdk import error_from_problem
from gpufleet.sdk_retry import RetryPolicy, parse_retry_after


@given(attempt=st.integers(1, 30), r=st.floats(0, 0.999999))
def test_backoff_is_bounded_by_cap_and_exponential_ceiling(attempt, r):
    policy = RetryPolicy()
    d = policy.delay(attempt, rand=lambda: r)
    assert 0 <= d <= min(policy.cap_s, policy.base_s * 2 ** (attempt - 1))


@given(seconds=st.floats(0, 10_000, allow_nan=False))
def test_retry_after_wins_and_is_capped(seconds):
    policy = RetryPolicy(max_retry_after_s=60)
    assert policy.delay(1, retry_after=seconds) == min(seconds, 60)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        (" 0 ", 0.0),
        ("-3", 0.0),
        ("", None),
        (None, None),
        ("soon", None),
        ("Thu, 01 Jan 1970 00:00:10 GMT", 0.0),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=100.0) == expected


def test_parse_retry_after_http_date_in_the_future():
    assert parse_retry_after("Thu, 01 Jan 1970 00:02:00 GMT", now=100.0) == pytest.approx(20.0)


def test_should_retry_rules():
    p = RetryPolicy(max_attempts=3)
    assert p.should_retry(None, 1) and p.should_retry(503, 2) and p.should_retry(429, 1)
    assert not p.should_retry(503, 3)
    assert not p.should_retry(404, 1) and not p.should_retry(400, 1) and not p.should_retry(422, 1)
    assert p.should_retry(409, 1, "https://gpufleet.dev/problems/idempotency-in-flight")
    assert not p.should_retry(409, 1, "https://gpufleet.dev/problems/invalid-transition")


def test_error_from_problem_prefers_the_type_slug_and_keeps_extras():
    err = error_from_problem(
        409,
        {
            "type": "https://gpufleet.dev/problems/invalid-transition",
            "detail": "job is\nSUCCEEDED",
            "current_status": "SUCCEEDED",
        },
    )
    assert isinstance(err, errors.InvalidTransition)
    assert err.detail == "job is SUCCEEDED" and err.extra == {"current_status": "SUCCEEDED"}
    assert (
        isinstance(error_from_problem(418, None), errors.GpufleetError) and error_from_problem(418, None).status == 418
    )
    quota = error_from_problem(429, {"detail": "x"}, {"retry-after": "12"})
    assert isinstance(quota, errors.QuotaExceeded) and quota.retry_after == 12


def test_profile_roundtrip_and_env_override(tmp_path, monkeypatch):
    path = write_profile(
        Profile(endpoint="http://127.0.0.1:9/", access_key_id="A", secret_access_key="S"), tmp_path / "p.json"
    )
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    assert load_profile(path).endpoint == "http://127.0.0.1:9"
    monkeypatch.setenv("GPUFLEET_ENDPOINT", "https://api.example.com")
    assert load_profile(path).endpoint == "https://api.example.com"


def test_profile_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_ENDPOINT", raising=False)
    monkeypatch.delenv("GPUFLEET_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(errors.ConfigError, match="gpufleet dev"):
        load_profile()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"endpoint": "ftp://x"}))
    with pytest.raises(errors.ConfigError, match="endpoint") as info:
        load_profile(bad)
    assert "\n" not in info.value.detail
