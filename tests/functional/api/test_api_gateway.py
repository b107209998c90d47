"""The local SigV4 gateway over loopback: signature checks, proxy events, and concurrency through it."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from api_helpers import ALICE, CAROL, KEYS, STRANGER, VIDEO, signed_request
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gpufleet.clock import SystemClock
from gpufleet.store import jobs as job_store

pytestmark = pytest.mark.xdist_group("api-gateway")


@pytest.fixture
def clock():
    return SystemClock()


@pytest.fixture
def settings_kw():
    return {"idempotency_wait_s": 10.0}


def _post(gw, key, body=VIDEO, arn=ALICE):
    return signed_request("POST", f"{gw.url}/v1/jobs", body, arn=arn, headers={"Idempotency-Key": key})


def test_good_signature_reaches_the_handler(gateway):
    r = _post(gateway, "g1")
    assert r.status_code == 202 and r.headers["Location"] == f"/v1/jobs/{r.json()['job_id']}"
    g = signed_request("GET", gateway.url + r.headers["Location"])
    assert g.status_code == 200 and g.json() == r.json()
    for method in ("TRACE", "QUERY", "PUT"):  # any method reaches the handler: a 404 problem, never a 5xx
        odd = signed_request(method, gateway.url + r.headers["Location"])
        assert odd.status_code == 404 and odd.headers["Content-Type"] == "application/problem+json"
    q = signed_request("GET", f"{gateway.url}/v1/jobs?limit=5&status=QUEUED")
    assert q.status_code == 200 and [j["job_id"] for j in q.json()["jobs"]] == [r.json()["job_id"]]


def test_bad_missing_or_forged_signatures_are_403(gateway):
    url = f"{gateway.url}/v1/jobs"
    body = json.dumps(VIDEO).encode()
    assert requests.get(url, timeout=10).status_code == 403  # no Authorization at all
    assert requests.get(url, headers={"Authorization": "AWS4-HMAC-SHA256 nonsense"}, timeout=10).status_code == 403
    akid, _ = KEYS[ALICE]
    wrong = signed_request("GET", url, key=(akid, "not-the-secret"))
    unknown = signed_request("GET", url, key=("AKIAUNKNOWN00000001", "whatever"))
    scope = signed_request("GET", url, service="s3")
    region = signed_request("GET", url, region="eu-west-1")
    assert [r.status_code for r in (wrong, unknown, scope, region)] == [403] * 4
    assert wrong.headers["Content-Type"] == "application/problem+json"

    def tampered(change):
        req = AWSRequest(
            method="POST", url=url, data=body, headers={"Idempotency-Key": "t1", "Content-Type": "application/json"}
        )
        SigV4Auth(Credentials(*KEYS[ALICE]), "execute-api", "us-east-1").add_auth(req)
        hdrs = dict(req.headers.items())
        data, target = change(hdrs, body, url)
        return requests.post(target, data=data, headers=hdrs, timeout=10)

    assert tampered(lambda h, b, u: (b.replace(b"fox", b"cat"), u)).status_code == 403  # body changed
    assert tampered(lambda h, b, u: (b, u + "?x=1")).status_code == 403  # query added
    assert tampered(lambda h, b, u: (h.update({"Idempotency-Key": "t2"}) or b, u)).status_code == 403  # signed header

    def stale(h, b, u):
        h["X-Amz-Date"] = "20200101T000000Z"
        return b, u

    assert tampered(stale).status_code == 403
    # Nothing reached the store.
    listed = signed_request("GET", url).json()["jobs"]
    assert listed == []


def test_verified_key_of_an_unregistered_principal_is_403(gateway):
    r = _post(gateway, "s1", arn=STRANGER)
    assert r.status_code == 403 and r.json()["type"].endswith("/forbidden")


def test_32_concurrent_identical_submissions_make_one_job(gateway, deps, serialized_dynamodb):
    barrier = threading.Barrier(32)

    def go(_):
        barrier.wait()
        return _post(gateway, "same-key")

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(go, range(32)))
    assert {r.status_code for r in results} == {202}
    assert len({r.content for r in results}) == 1
    assert sum(1 for r in results if r.headers.get("Idempotent-Replayed") != "true") == 1
    jobs, _ = job_store.list_jobs(deps.ddb, deps.settings.jobs_table, tenant="t1", secret=b"x", limit=100)
    assert len(jobs) == 1 and jobs[0]["job_id"] == results[0].json()["job_id"]


def test_tenant_isolation_over_the_gateway(gateway):
    job = _post(gateway, "iso").json()
    base = f"{gateway.url}/v1/jobs/{job['job_id']}"
    assert signed_request("GET", base, arn=CAROL).status_code == 404
    assert signed_request("DELETE", base, arn=CAROL).status_code == 404
    assert signed_request("GET", f"{gateway.url}/v1/jobs", arn=CAROL).json()["jobs"] == []
    assert signed_request("GET", base).json()["cancel_requested"] is False


def test_paging_while_jobs_arrive_has_no_duplicates_or_gaps(gateway, serialized_dynamodb):
    before = [_post(gateway, f"pre{i}").json()["job_id"] for i in range(9)]
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 40:
            _post(gateway, f"new{i}")
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        seen, cursor = [], None
        while True:
            q = "limit=2" + (f"&cursor={cursor}" if cursor else "")
            page = signed_request("GET", f"{gateway.url}/v1/jobs?{q}").json()
            seen += [j["job_id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
    finally:
        stop.set()
        t.join()
    assert len(seen) == len(set(seen))
    assert [j for j in seen if j in before] == list(reversed(before))


def _raw(gw, request: bytes, timeout: float = 10.0) -> bytes:
    import socket

    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        while True:
            chunk = s.recv(65536)  # the gateway closes the connection after a refusal
            if not chunk:
                return out
            out += chunk


@pytest.mark.parametrize(
    "framing,status,slug",
    [
        (b"Content-Length: -1\r\n", 400, "bad-request"),
        (b"Content-Length: -50331648\r\n", 400, "bad-request"),
        (b"Content-Length: abc\r\n", 400, "bad-request"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400, "bad-request"),
        (b"Transfer-Encoding: chunked\r\n", 411, "length-required"),
        (b"Content-Length: 99999999999\r\n", 413, "payload-too-large"),
    ],
)
def test_body_framing_is_refused_before_reading_with_a_problem(gateway, framing, status, slug):
    # no body follows and the connection stays open: an answer proves nothing was waited for
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + framing + b"\r\n"
    t0 = time.monotonic()
    resp = _raw(gateway, head)
    assert time.monotonic() - t0 < 5
    status_line, _, rest = resp.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.split()[1] == str(status).encode(), resp[:300]
    assert b"Content-Type: application/problem+json" in headers and b"Connection: close" in headers
    doc = json.loads(body)
    assert doc["status"] == status and doc["type"].endswith("/" + slug)


def test_oversize_body_is_a_problem_413_not_an_html_page(gateway):
    r = signed_request("POST", f"{gateway.url}/v1/jobs", b" " * (5 << 20), headers={"Idempotency-Key": "big"})
    assert r.status_code == 413 and r.headers["Content-Type"] == "application/problem+json"
    assert r.json()["type"].endswith("/payload-too-large") and r.json()["limit"] == 4 << 20
    assert signed_request("GET", f"{gateway.url}/v1/jobs").json()["jobs"] == []


def test_a_signed_content_hash_must_be_the_body_received(gateway):
    import hashlib

    url = f"{gateway.url}/v1/jobs"
    body = json.dumps(VIDEO).encode()

    def send(sha: str, data: bytes, key: str):
        req = AWSRequest(method="POST", url=url, data=body, headers={
            "Idempotency-Key": key, "Content-Type": "application/json", "X-Amz-Content-SHA256": sha})
        SigV4Auth(Credentials(*KEYS[ALICE]), "execute-api", "us-east-1").add_auth(req)
        return requests.post(url, data=data, headers=dict(req.headers.items()), timeout=10)

    cat = body.replace(b"fox", b"cat")
    assert send("UNSIGNED-PAYLOAD", cat, "u1").status_code == 403  # was 202: the body was never checked
    assert send("UNSIGNED-PAYLOAD", body, "u2").status_code == 403
    assert send(hashlib.sha256(body).hexdigest(), cat, "u3").status_code == 403
    assert send(hashlib.sha256(cat).hexdigest(), body, "u4").status_code == 403  # a hash of another body
    assert signed_request("GET", url).json()["jobs"] == []  # nothing reached the store
    assert send(hashlib.sha256(body).hexdigest(), body, "u5").status_code == 202
