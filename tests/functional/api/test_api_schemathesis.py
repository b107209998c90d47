"""Fuzzing the API through the local gateway over loopback, every request SigV4-signed.

- schemathesis over the OpenAPI document, valid and invalid (negative) inputs:
  for a bounded number of generated requests per operation, no 5xx, every status
  code, content type, header and body is the one the document declares, and
  every signed request passes the gateway's signature check.
- Hand-written malformed bodies (bad UTF-8, deep nesting, wrong content types,
  huge numbers, NaN/Infinity, duplicate keys, oversize) and job specs with a
  wrong JSON type at every level: each is a 4xx problem (400 ``validation`` with
  ``errors[]``, 413 or 415), counted as ``ClientErrors`` and never as
  ``ServerErrors`` (the 5xx alarm).
Bounded: about 150 schemathesis cases, 40 hand-written and 80 generated bodies;
about a minute on a loaded machine.
"""

from __future__ import annotations

import json
import re

import boto3
import pytest
import requests
import schemathesis
from api_helpers import ALICE, KEYS, REGION, SECRET, VIDEO, register_principals, signed_request
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from fast_moto import fast_mock_aws
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpufleet.api.app import build_openapi
from gpufleet.api.settings import load
from gpufleet.api.wiring import build_api
from gpufleet.clock import FakeClock, SystemClock
from gpufleet.devstack.gateway import Gateway, LocalCredential
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

pytestmark = pytest.mark.xdist_group("api-schemathesis")

SCHEMA = schemathesis.openapi.from_dict(build_openapi(build_api(load(cursor_secret=SECRET), ddb=None, clock=FakeClock()).app))
SCHEMA.config.phases.update(phases=["examples", "fuzzing"])
SCHEMA.config.generation.update(modes=list(schemathesis.GenerationMode))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


class SigV4RequestsAuth(requests.auth.AuthBase):
    """Sign a prepared ``requests`` request with SigV4 for execute-api (what the SDK does)."""

    def __init__(self, akid: str, secret: str) -> None:
        self.creds = Credentials(akid, secret)

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        body = r.body.encode() if isinstance(r.body, str) else (r.body or b"")
        req = AWSRequest(method=r.method, url=r.url, data=body, headers={"Host": r.url.split("/")[2]})
        SigV4Auth(self.creds, "execute-api", REGION).add_auth(req)
        for k in ("Authorization", "X-Amz-Date"):
            r.headers[k] = req.headers[k]
        r.headers["Host"] = req.headers["Host"]
        return r


@pytest.fixture(scope="module")
def live():
    with fast_mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        for b in ("gpufleet-outputs", "gpufleet-logs"):
            s3.create_bucket(Bucket=b)
        names = TableNames()
        create_tables(ddb, names)
        register_principals(ddb, names.control)
        # no request rate limit here: a 429 would hide what the fuzzed request does
        kms = boto3.client("kms", region_name=REGION)  # the tenants' webhook signing secrets are KMS-encrypted
        key_id = kms.create_key(Description="webhook secrets")["KeyMetadata"]["Arn"]
        settings = load(cursor_secret=SECRET, idempotency_wait_s=0.1, tenant_rate_limit=0, webhook_key_id=key_id)
        sfn, batch = boto3.client("stepfunctions", region_name=REGION), boto3.client("batch", region_name=REGION)
        creds = [
            LocalCredential(access_key_id=a, secret_access_key=s, principal_arn=arn) for arn, (a, s) in KEYS.items()
        ]
        with Gateway(lambda: build_api(settings, ddb=ddb, s3=s3, sfn=sfn, batch=batch, kms=kms,
                                       clock=SystemClock()).handle, creds, region=REGION) as gw:
            session = requests.Session()
            session.auth = SigV4RequestsAuth(*KEYS[ALICE])
            seeded = session.post(f"{gw.url}/v1/jobs", json=VIDEO, headers={"Idempotency-Key": "seed"}, timeout=30)
            assert seeded.status_code == 202
            yield gw, session


@SCHEMA.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case, live):
    gw, session = live
    response = case.call(base_url=gw.url, session=session, timeout=30)
    # the signature is always accepted; a 403 is only the server's authorization of an operator-only action
    # (alice is a tenant, not an operator), never a rejected request
    assert response.status_code != 403 or "operator" in response.json().get("detail", ""), \
        f"signed request rejected: {response.text}"
    case.validate_response(response, checks=CHECKS)


# ------------------------------------------------------------------ hand-written malformed bodies

FULL_VIDEO = {
    "workload": {"kind": "video.generate", "prompt": "a fox", "negative_prompt": "", "model": "wan-tiny",
                 "frames": 9, "width": 256, "height": 256, "steps": 10, "seed": 0, "guidance": 5.0},
    "resources": {"gpus": 1.0, "gpu_type": "any", "cpu": 1.0, "memory_gb": 4.0, "nodes": 1},
    "priority": 100,
    "data": {"inputs": ["s3://gpufleet-outputs/tenants/t1/in.bin"], "residency": ["eu"]},
    "webhook": {"url": "https://example.com/hook"},
    "labels": {"team": "a"},
    "pools": ["onprem-a"],
}
FULL_CONTAINER = {
    "workload": {"kind": "container", "image": "localhost/tools:1", "command": ["true"], "env": {"A": "b"},
                 "checkpoint_dir": "/job/ckpt", "checkpoint_interval_s": 60},
    "resources": {"gpus": 0.5},
}
DEEP = b"[" * 50_000 + b"]" * 50_000
VIDEO_BYTES = json.dumps(VIDEO).encode()
#: (name, Content-Type, raw body) → the status each must get
MALFORMED = [
    ("bad utf-8", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "\xff\xfe"}}', 400),
    ("lone surrogate bytes", "application/json", b'{"a": "\xed\xa0\x80"}', 400),
    ("utf-16", "application/json", VIDEO_BYTES.decode().encode("utf-16"), 400),
    ("deep list 50000", "application/json", DEEP, 400),
    ("deep object 33", "application/json", b'{"a":' * 33 + b"1" + b"}" * 33, 400),
    ("deep under the size limit", "application/json", b'{"workload":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
    ("text/plain", "text/plain", VIDEO_BYTES, 415),
    ("application/xml", "application/xml", b"<job><prompt>x</prompt></job>", 415),
    ("form", "application/x-www-form-urlencoded", b"workload=x", 415),
    ("multipart", "multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--", 415),
    ("problem+json", "application/problem+json", VIDEO_BYTES, 415),
    ("empty content type", "", VIDEO_BYTES, 202),
    ("json with charset", "application/json; charset=utf-8", VIDEO_BYTES, 202),
    ("float 1e400", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "guidance": 1e400}}', 400),
    ("float -1e400", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x"}, "resources": {"gpus": -1e400}}', 400),
    ("int 10**400", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "seed": %d}}' % 10**400, 400),
    ("int 10**60", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "seed": %d}}' % 10**60, 400),
    ("int 10**5000", "application/json", b'{"priority": 1' + b"0" * 5000 + b"}", 400),
    ("tiny float", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x"}, "resources": {"gpus": 1e-400}}', 400),
    ("gpus 1e200", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x"}, "resources": {"gpus": 1e200}}', 400),
    ("NaN", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "guidance": NaN}}', 400),
    ("Infinity", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "guidance": Infinity}}', 400),
    ("-Infinity", "application/json", b'{"priority": -Infinity}', 400),
    ("duplicate keys", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "x", "prompt": "y"}}', 400),
    ("duplicate top keys", "application/json", b'{"priority": 1, "priority": 2, "workload": {"kind": "video.generate", "prompt": "x"}}', 400),
    ("truncated", "application/json", VIDEO_BYTES[:-3], 400),
    ("trailing garbage", "application/json", VIDEO_BYTES + b" x", 400),
    ("two documents", "application/json", VIDEO_BYTES + VIDEO_BYTES, 400),
    ("bom", "application/json", b"\xef\xbb\xbf" + VIDEO_BYTES, 400),
    ("nul byte", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "a\x00b"}}', 400),
    ("escaped nul", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "a\\u0000b"}}', 400),
    ("lone surrogate escape", "application/json", b'{"workload": {"kind": "video.generate", "prompt": "\\ud800"}}', 400),
    ("array", "application/json", b"[]", 400),
    ("string", "application/json", b'"job"', 400),
    ("number", "application/json", b"1", 400),
    ("null", "application/json", b"null", 400),
    ("whitespace only", "application/json", b"   ", 400),
    ("oversize for the API", "application/json", b'{"workload": "' + b"x" * 300_000 + b'"}', 413),
    ("oversize for the gateway", "application/json", b" " * (2 << 20), 413),
    ("huge key count", "application/json", json.dumps({f"k{i}": i for i in range(5_000)}).encode(), 400),
]


def _emf(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"CloudWatchMetrics"' in line]


@pytest.mark.parametrize("name,ctype,raw,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_bodies_are_4xx_problems_counted_as_client_errors(live, capsys, name, ctype, raw, expected):
    gw, _ = live
    capsys.readouterr()
    r = signed_request("POST", f"{gw.url}/v1/jobs", raw, headers={"Content-Type": ctype, "Idempotency-Key": "m-" + re.sub(r"\W", "-", name)})
    assert r.status_code == expected, (name, r.status_code, r.text[:300])
    if expected >= 400:
        assert r.headers["Content-Type"] == "application/problem+json", name
        doc = r.json()
        assert doc["status"] == expected
        if expected == 400:
            assert doc["type"].endswith("/validation") and doc["errors"], doc
            assert all(set(e) == {"field", "message"} for e in doc["errors"])
    emf = _emf(capsys.readouterr().out)
    assert not any("ServerErrors" in m for m in emf), name
    if len(raw) <= (4 << 20):  # the API answered (the gateway refuses larger bodies before reading them)
        assert sum(m.get("ClientErrors", [0])[0] for m in emf) == (1 if expected >= 400 else 0), name


def _paths(value, prefix=()):
    """Every path to a value in a JSON document (the document itself included)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replace(doc, path, marker):
    if not path:
        return marker
    doc = json.loads(json.dumps(doc))
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = marker
    return doc


#: raw JSON literals of every type (and the extremes): substituted as text, so 1e400 and 10**400 stay literal
WRONG = ["null", "true", "false", "0", "-1", "1.5", "1e400", "-1e400", str(10**400), "1e-400", "\"\"",
         json.dumps("x" * 5000), json.dumps("\u0000"), "[]", "[null]", "{}", '{"a": {}}', "[[[[[[[[]]]]]]]]",
         json.dumps(["x"] * 300), json.dumps({f"k{i}": "v" for i in range(100)})]
TARGETS = [(doc, path) for doc in (FULL_VIDEO, FULL_CONTAINER) for path in _paths(doc)]


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(target=st.sampled_from(TARGETS), literal=st.sampled_from(WRONG))
def test_a_wrong_json_type_at_any_level_is_never_a_5xx(live, target, literal):
    gw, _ = live
    doc, path = target
    raw = re.sub(r'"@@WRONG@@"', lambda _m: literal, json.dumps(_replace(doc, path, "@@WRONG@@"))).encode()
    r = signed_request("POST", f"{gw.url}/v1/jobs", raw, headers={"Idempotency-Key": f"w-{hash(raw)}"})
    assert r.status_code < 500, (path, literal, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.headers["Content-Type"] == "application/problem+json"
        if r.status_code == 400 and r.json()["type"].endswith("/validation"):
            assert r.json()["errors"]
