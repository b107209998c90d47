"""The web console's loopback server and the page's SigV4 signer.

- The browser's signer (gpufleet/webconsole/sigv4.js, run under Node's Web Crypto) produces signatures the
  gateway's verifier accepts, for queries with repeated and encoded values and for bodies; a changed
  byte is refused.
- The server: assets with a strict CSP, nothing outside the asset folder, the page's credentials only to
  the page (not cross-site, never for another Host), and /v1 passed to a real gateway that verifies
  the signature made for the console's host and hands the handler the caller's principal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gpufleet.devstack.gateway import Gateway, LocalCredential, verify_sigv4
from gpufleet.devstack.webconsole import ConsoleServer
from gpufleet.errors import Unauthorized
from gpufleet.webconsole import ASSETS, csp

CRED = LocalCredential(access_key_id="AKIACONSOLETEST1", secret_access_key="s3cr3t/+x",
                       principal_arn="arn:aws:iam::123456789012:user/dev")
CONFIG = {"region": "us-east-1", "service": "execute-api", "identity": CRED.principal_arn,
          "credentials": {"access_key_id": CRED.access_key_id, "secret_access_key": CRED.secret_access_key}}

NODE_SIGN = """
import { sign, canonicalQuery } from %(module)s;
const cases = JSON.parse(process.argv[1]);
const out = [];
for (const c of cases) {
  const query = canonicalQuery(c.query);
  const headers = await sign({ method: c.method, host: c.host, path: c.path, query, body: c.body,
    credentials: c.credentials, region: "us-east-1", service: "execute-api" });
  out.push({ query, headers });
}
console.log(JSON.stringify(out));
"""


def _node_sign(cases: list[dict]) -> list[dict]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the browser signer cannot be run outside a browser here")
    script = NODE_SIGN % {"module": json.dumps((ASSETS / "sigv4.js").as_uri())}
    done = subprocess.run([node, "--input-type=module", "-e", script, json.dumps(cases)], capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_the_pages_signatures_verify_at_the_gateway():
    creds = CONFIG["credentials"]
    cases = [
        {"method": "GET", "host": "127.0.0.1:8643", "path": "/v1/jobs", "body": "", "credentials": creds,
         "query": [["status", "RUNNING"], ["status", "PENDING"], ["label", "team=vision ü"], ["limit", "50"]]},
        {"method": "POST", "host": "localhost:9", "path": "/v1/jobs", "query": [], "credentials": creds,
         "body": json.dumps({"workload": {"kind": "video.generate", "prompt": "a fox ü"}})},
        {"method": "DELETE", "host": "127.0.0.1:8643", "path": "/v1/jobs/j-abc", "query": [], "body": "",
         "credentials": {**creds, "session_token": "tok"}},
    ]
    signed = _node_sign(cases)
    token_cred = CRED.model_copy(update={"session_token": "tok"})
    for case, got in zip(cases, signed, strict=True):
        url = f"http://{case['host']}{case['path']}" + (f"?{got['query']}" if got["query"] else "")
        body = case["body"].encode()
        book = {CRED.access_key_id: token_cred if "session_token" in case["credentials"] else CRED}
        who = verify_sigv4(case["method"], url, {"Host": case["host"], **got["headers"]}, body, book,
                           region="us-east-1")
        assert who.principal_arn == CRED.principal_arn
        with pytest.raises(Unauthorized):  # one byte more, or another host: refused
            verify_sigv4(case["method"], url, {"Host": case["host"], **got["headers"]}, body + b" ", book,
                         region="us-east-1")
        with pytest.raises(Unauthorized):
            verify_sigv4(case["method"], url, {"Host": "evil:1", **got["headers"]}, body, book, region="us-east-1")
    assert signed[0]["query"] == "label=team%3Dvision%20%C3%BC&limit=50&status=PENDING&status=RUNNING"


@pytest.fixture()
def served():
    seen: list[dict] = []

    def handler(event, context):
        seen.append(event)
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"},
                "body": json.dumps({"user": event["requestContext"]["identity"]["userArn"], "path": event["path"]})}

    with Gateway(lambda: handler, [CRED]) as gw, ConsoleServer(lambda: gw.url, lambda: CONFIG,
                                                               media_origin=lambda: "http://127.0.0.1:5") as console:
        yield console, seen


def _get(url: str, headers: dict | None = None, method: str = "GET", data: bytes | None = None):
    req = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read()


def test_assets_are_served_with_a_strict_policy(served):
    console, _ = served
    status, headers, body = _get(console.url)
    assert status == 200 and b'src="/assets/app.js"' in body
    assert headers["Content-Security-Policy"] == csp(["http://127.0.0.1:5"])
    assert "script-src 'self';" in headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"
    status, headers, _ = _get(console.url + "assets/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    for path in ("assets/../webconsole.py", "assets/__init__.py", "assets/%2e%2e%2fstack.py", "etc/passwd",
                 "assets/nothing.js"):
        assert _get(console.url + path)[0] == 404, path
    assert _get(console.url, method="POST", data=b"x")[0] == 405


def test_credentials_only_to_the_page_itself(served):
    console, _ = served
    status, headers, body = _get(console.url + "console/config.json", {"Sec-Fetch-Site": "same-origin"})
    assert status == 200 and headers["Cache-Control"] == "no-store"
    conf = json.loads(body)
    assert conf["credentials"]["access_key_id"] == CRED.access_key_id and conf["media_origin"] == "http://127.0.0.1:5"
    assert _get(console.url + "console/config.json", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert _get(console.url + "console/config.json", {"Origin": "http://evil.example"})[0] == 403
    # a page on another name that resolves to 127.0.0.1 (DNS rebinding) sends its own Host: nothing
    port = console.url.rsplit(":", 1)[1].strip("/")
    assert _get(console.url + "console/config.json", {"Host": f"evil.example:{port}"})[0] == 421


def test_api_requests_reach_the_gateway_signed_for_the_consoles_host(served):
    console, seen = served
    url = console.url + "v1/jobs?limit=5"
    req = AWSRequest(method="GET", url=url, headers={})
    SigV4Auth(Credentials(CRED.access_key_id, CRED.secret_access_key), "execute-api", "us-east-1").add_auth(req)
    status, _, body = _get(url, dict(req.headers.items()))
    assert status == 200, body
    assert json.loads(body) == {"user": CRED.principal_arn, "path": "/v1/jobs"}
    assert seen[-1]["queryStringParameters"] == {"limit": "5"}
    status, headers, body = _get(url)  # unsigned: the gateway refuses, the console adds no authority
    assert status == 403 and headers["Content-Type"] == "application/problem+json"
    assert len(seen) == 1
    big = _get(console.url + "v1/jobs", {"Content-Length": str(5 << 20)}, method="POST", data=b"")
    assert big[0] in (413, 400)


def test_every_asset_the_page_loads_exists():
    html = (ASSETS / "index.html").read_text()
    assert "/assets/app.js" in html and "/assets/style.css" in html
    for js in ASSETS.glob("*.js"):
        for line in js.read_text().splitlines():
            if line.startswith("import ") and "from \"./" in line:
                target = line.split('from "./', 1)[1].split('"', 1)[0]
                assert (ASSETS / target).is_file(), f"{js.name} imports a missing {target}"
    # the console loads nothing from another origin; only the AWS sign-in names one (the Cognito endpoints it
    # calls, which the deployed CSP's connect-src admits)
    assert [p.name for p in ASSETS.glob("*.js") if "http://" in p.read_text() or "https://" in p.read_text()] in (
        [], ["signin_flow.js"]), "the console loads nothing from another origin"
    assert "http://" not in (ASSETS / "signin_flow.js").read_text()
    assert Path(ASSETS / "__init__.py").is_file()
