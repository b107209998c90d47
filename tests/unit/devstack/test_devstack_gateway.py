"""The gateway's SigV4 verification (pure): botocore-signed requests pass, anything else is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.devstack.gateway import LocalCredential, build_event, verify_sigv4
from gpufleet.errors import Unauthorized

CRED = LocalCredential(access_key_id="AKIATEST", secret_access_key="s3cr3t", principal_arn="arn:aws:iam::1:user/a")
CREDS = {CRED.access_key_id: CRED}
URL = "http://127.0.0.1:8080/v1/jobs?limit=2"


def _signed(body=b'{"a":1}', url=URL, secret="s3cr3t", token=None, service="execute-api", region="us-east-1"):
    req = AWSRequest(method="POST", url=url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials("AKIATEST", secret, token), service, region).add_auth(req)
    return dict(req.headers.items())


def test_botocore_signature_verifies():
    h = _signed()
    assert verify_sigv4("POST", URL, h, b'{"a":1}', CREDS, region="us-east-1").principal_arn == CRED.principal_arn


@given(st.binary(max_size=64))
def test_changed_body_is_refused(extra):
    h = _signed()
    body = b'{"a":1}' + extra
    if extra:
        with pytest.raises(Unauthorized):
            verify_sigv4("POST", URL, h, body, CREDS, region="us-east-1")


def test_other_failures_are_refused():
    h = _signed()
    cases = [
        ("POST", URL, {k: v for k, v in h.items() if k != "Authorization"}, b'{"a":1}'),
        ("GET", URL, h, b'{"a":1}'),
        ("POST", URL.replace("limit=2", "limit=3"), h, b'{"a":1}'),
        ("POST", URL, _signed(secret="wrong"), b'{"a":1}'),
        ("POST", URL, _signed(service="s3"), b'{"a":1}'),
        ("POST", URL, _signed(region="eu-west-1"), b'{"a":1}'),
        ("POST", URL, {**h, "Authorization": h["Authorization"].replace("AKIATEST", "AKIAOTHER")}, b'{"a":1}'),
    ]
    for method, url, headers, body in cases:
        with pytest.raises(Unauthorized):
            verify_sigv4(method, url, headers, body, CREDS, region="us-east-1")


def test_clock_skew_and_session_token():
    h = _signed()
    later = datetime.now(UTC) + timedelta(minutes=6)
    with pytest.raises(Unauthorized):
        verify_sigv4("POST", URL, h, b'{"a":1}', CREDS, region="us-east-1", now=later)
    tok = LocalCredential(**{**CRED.model_dump(), "session_token": "tok"})
    with pytest.raises(Unauthorized):
        verify_sigv4("POST", URL, h, b'{"a":1}', {tok.access_key_id: tok}, region="us-east-1")
    ok = _signed(token="tok")
    verify_sigv4("POST", URL, ok, b'{"a":1}', {tok.access_key_id: tok}, region="us-east-1")


def test_build_event_is_a_rest_proxy_event():
    ev = build_event("GET", "/v1/jobs?status=QUEUED&status=PENDING&limit=2", {"Host": "h"}, b"", user_arn="arn:x/u")
    assert ev["httpMethod"] == "GET" and ev["path"] == "/v1/jobs"
    assert ev["multiValueQueryStringParameters"] == {"status": ["QUEUED", "PENDING"], "limit": ["2"]}
    assert ev["queryStringParameters"]["limit"] == "2" and ev["body"] is None
    assert ev["requestContext"]["identity"]["userArn"] == "arn:x/u"


def test_the_signed_body_hash_must_be_the_body_received():
    import hashlib

    from gpufleet.devstack.gateway import verify_sigv4 as verify

    body = b'{"a":1}'

    def signed_with(sha: str):
        req = AWSRequest(method="POST", url=URL, data=body,
                         headers={"Content-Type": "application/json", "X-Amz-Content-SHA256": sha})
        SigV4Auth(Credentials("AKIATEST", "s3cr3t"), "execute-api", "us-east-1").add_auth(req)
        return dict(req.headers.items())

    good = signed_with(hashlib.sha256(body).hexdigest())
    assert verify("POST", URL, good, body, CREDS, region="us-east-1").principal_arn == CRED.principal_arn
    with pytest.raises(Unauthorized):
        verify("POST", URL, good, b'{"a":2}', CREDS, region="us-east-1")
    for sha in ("UNSIGNED-PAYLOAD", hashlib.sha256(b"other").hexdigest(), "STREAMING-UNSIGNED-PAYLOAD-TRAILER"):
        with pytest.raises(Unauthorized):  # the signature matches, but the hash it signs is not the body's
            verify("POST", URL, signed_with(sha), body, CREDS, region="us-east-1")


@pytest.mark.parametrize(
    "headers,expected",
    [
        ([], 0),
        ([("Content-Length", "0")], 0),
        ([("Content-Length", "12")], 12),
        ([("content-length", " 7 ")], 7),
        ([("Content-Length", "7"), ("Content-Length", "7")], 7),
        ([("Content-Length", "-1")], "bad-request"),
        ([("Content-Length", "+5")], "bad-request"),
        ([("Content-Length", "0x10")], "bad-request"),
        ([("Content-Length", "")], "bad-request"),
        ([("Content-Length", "١٢")], "bad-request"),  # non-ASCII digits
        ([("Content-Length", "5"), ("Content-Length", "6")], "bad-request"),
        ([("Content-Length", "5, 6")], "bad-request"),
        ([("Transfer-Encoding", "chunked")], "length-required"),
        ([("Transfer-Encoding", "chunked"), ("Content-Length", "5")], "length-required"),
        ([("Content-Length", str((4 << 20) + 1))], "payload-too-large"),
        ([("Content-Length", "9" * 40)], "payload-too-large"),
    ],
)
def test_body_framing_is_checked_before_reading(headers, expected):
    from gpufleet.devstack.gateway import body_length
    from gpufleet.errors import GpufleetError

    if isinstance(expected, int):
        assert body_length(headers) == expected
    else:
        with pytest.raises(GpufleetError) as got:
            body_length(headers)
        assert got.value.type_slug == expected and 400 <= got.value.status < 500
