"""What request bodies the API reads (gpufleet.api.body): every refusal is a 4xx with errors[], never a crash."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.api import body
from gpufleet.api.problems import to_problem
from gpufleet.errors import GpufleetError, PayloadTooLarge, UnsupportedMediaType, ValidationFailed


def _event(raw: bytes, content_type: str | None = "application/json", method: str = "POST") -> dict:
    try:
        text, b64 = raw.decode("utf-8"), False
    except UnicodeDecodeError:
        text, b64 = base64.b64encode(raw).decode(), True
    headers = {} if content_type is None else {"Content-Type": content_type}
    return {"httpMethod": method, "path": "/v1/jobs", "headers": headers, "body": text or None, "isBase64Encoded": b64}


@pytest.mark.parametrize(
    "raw,message",
    [
        (b'{"a": "\xff\xfe"}', "not valid UTF-8"),
        (b"[" * 50_000 + b"]" * 50_000, "nested deeper than 32"),
        (b'{"a":' * 33 + b"1" + b"}" * 33, "nested deeper than 32"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"a": 1, "a": 2}', "duplicate member name 'a'"),
        (b'{"a": %d}' % 10**400, "more than 64 digits"),
        (b'{"a": ', "not valid JSON"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),  # a BOM is not JSON text
    ],
)
def test_malformed_json_is_a_400_naming_the_body(raw, message):
    with pytest.raises(ValidationFailed) as got:
        body.check(_event(raw))
    assert message in got.value.detail
    status, _, text = to_problem(got.value, "/v1/jobs")
    doc = json.loads(text)
    assert status == 400 and doc["errors"][0]["field"] == "body" and message in doc["errors"][0]["message"]


def test_accepted_bodies():
    ok = b'{"a": [1, 2.5, 1e400, {"b": null}], "c": "\xc3\xa9"}'
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON", None):
        body.check(_event(ok, ctype))
    body.check(_event(b'{"a":' * 32 + b"1" + b"}" * 32))  # exactly the deepest allowed
    body.check(_event(b"", "text/plain"))  # no body: nothing to refuse
    body.check(_event(b"<a/>", "application/xml", method="GET"))  # GET bodies are not read (as before)
    assert body.loads('{"n": 123}') == {"n": 123}


@pytest.mark.parametrize("ctype", ["text/plain", "application/xml", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/problem+json", "json"])
def test_other_media_types_are_415(ctype):
    with pytest.raises(UnsupportedMediaType) as got:
        body.check(_event(b"{}", ctype))
    assert got.value.status == 415 and got.value.extra["accepted"] == ["application/json"]


def test_size_is_checked_first():
    with pytest.raises(PayloadTooLarge) as got:
        body.check(_event(b"\xff" * (body.MAX_BYTES + 1), "text/plain"))
    assert got.value.extra == {"field": "body", "limit": body.MAX_BYTES}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512) | st.text(max_size=256).map(str.encode))
def test_any_bytes_are_accepted_or_refused_with_a_4xx(raw):
    try:
        body.check(_event(raw))
    except GpufleetError as err:
        assert 400 <= err.status < 500
        assert err.extra.get("errors") or err.status != 400
