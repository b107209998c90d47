"""A scripted HTTP server on 127.0.0.1 that checks SigV4 signatures itself (for SDK tests).

Each request is verified by recomputing its signature with botocore from what arrived on
the wire (method, path, query, the signed headers, body) and the known secret; the result is
recorded with the request. Responses are taken from a script (a list of
``(status, headers, body)``), or from a handler function.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ACCESS_KEY = "AKIDLOOPBACKTEST"
SECRET_KEY = "loopback-secret-key"
REGION = "us-east-1"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def verify_sigv4(method: str, url: str, headers: dict[str, str], body: bytes, secret: str = SECRET_KEY) -> bool:
    """Recompute the SigV4 signature of a received request and compare it with the one sent."""
    auth = headers.get("Authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
    access_key, date, region, service, _ = parts["Credential"].split("/")
    signed = parts["SignedHeaders"].split(";")
    lower = {k.lower(): v for k, v in headers.items()}
    req = AWSRequest(method=method, url=url, data=body or None, headers={h: lower[h] for h in signed if h in lower})
    req.context["timestamp"] = lower["x-amz-date"]
    signer = SigV4Auth(Credentials(access_key, secret), service, region)
    canonical = signer.canonical_request(req)
    expected = signer.signature(signer.string_to_sign(req, canonical), req)
    return expected == parts["Signature"] and date == lower["x-amz-date"][:8]


@dataclass
class LoopbackServer:
    script: list[tuple[int, dict[str, str], Any]] = field(default_factory=list)
    handler: Callable[[Seen], tuple[int, dict[str, str], Any]] | None = None
    seen: list[Seen] = field(default_factory=list)

    def start(self) -> LoopbackServer:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = dict(self.headers.items())
                url = f"http://{headers.get('Host')}{self.path}"
                seen = Seen(self.command, self.path, headers, body, verify_sigv4(self.command, url, headers, body))
                outer.seen.append(seen)
                if outer.handler is not None:
                    status, out_headers, out_body = outer.handler(seen)
                elif outer.script:
                    status, out_headers, out_body = outer.script.pop(0)
                else:
                    status, out_headers, out_body = 500, {}, {"detail": "script exhausted"}
                raw = out_body if isinstance(out_body, bytes) else json.dumps(out_body).encode()
                self.send_response(status)
                ctype = "application/problem+json" if status >= 400 else "application/json"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                for k, v in out_headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
