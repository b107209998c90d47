"""The web console on loopback: its assets, the caller's credentials for the page, and /v1 passed to the gateway.

Contract:
- :class:`ConsoleServer` listens on 127.0.0.1 only and answers only requests whose ``Host`` is its own
  address (``127.0.0.1:<port>`` or ``localhost:<port>``); any other Host (a DNS-rebinding page) gets 421.
- ``GET /`` and ``GET /assets/<name>`` serve the console's files (:data:`~gpufleet.webconsole.ASSETS`; names are one path segment of ``[A-Za-z0-9._-]``, nothing else is
  reachable) with a strict Content-Security-Policy (scripts, styles and API calls from this origin
  only; media also from ``media_origin``, where presigned output links point), ``nosniff``,
  ``no-referrer`` and ``frame-ancestors 'none'``.
- ``GET /console/config.json`` hands the page the region, the signing service and the credentials
  ``config()`` returns (the dev profile's: the page signs with the caller's own identity). It is
  answered only to the page itself: a ``Sec-Fetch-Site`` other than ``same-origin``/``none`` or an
  ``Origin`` other than this server's gets 403, and it is never cached. In AWS this endpoint does not
  exist: the page gets short-lived credentials from a Cognito identity pool (docs/console.md).
- Every ``/v1/...`` request is passed unchanged (method, path, headers including ``Host``, body) to the
  gateway at ``upstream()`` and its answer relayed: the gateway verifies the page's SigV4 signature,
  made for this origin's host, exactly as it verifies any client's. The console holds no authority of
  its own. Bodies over the gateway's limit are refused here (413 problem, :func:`~gpufleet.devstack.gateway.body_length`)
  before they are read.
- Anything else is a 404.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufleet.devstack.gateway import AnsweringHandler, body_length, problem_response
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.webconsole import ASSETS, csp

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_ASSET = re.compile(r"^/assets/([A-Za-z0-9][A-Za-z0-9._-]{0,100})$")
#: hop-by-hop headers (RFC 9110 §7.6.1): never passed on
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length"}
#: how long the gateway may take to answer one request
UPSTREAM_TIMEOUT_S = 60.0


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Server(ThreadingHTTPServer):
    request_queue_size = 64
    daemon_threads = True


class ConsoleServer:
    """The console's loopback server (see the module doc); a devstack component (start/stop/describe).

    ``upstream`` returns the gateway's base URL (known once the gateway started); ``config`` the
    page's configuration: ``region``, ``service`` and ``credentials`` (``access_key_id``,
    ``secret_access_key``, optional ``session_token``) and ``identity`` (the principal's ARN).
    """

    name = "web console"

    def __init__(self, upstream: Callable[[], str], config: Callable[[], dict[str, Any]], *, port: int = 0,
                 media_origin: Callable[[], str | None] = lambda: None, assets: Path = ASSETS) -> None:
        self.upstream = upstream
        self.config = config
        self.media_origin = media_origin
        self.assets = assets
        self.port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise ConfigError("the console is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> ConsoleServer:
        try:
            self._server = _Server(("127.0.0.1", self.port), self._request_class())
        except OSError as err:
            raise ConfigError(f"cannot listen on 127.0.0.1:{self.port}: {err.strerror} (try --console-port 0)")
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpufleet-console", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def describe(self) -> dict[str, str]:
        return {"web console": self.url}

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- answers

    def own_hosts(self) -> set[str]:
        port = self._server.server_address[1] if self._server else self.port
        return {f"127.0.0.1:{port}", f"localhost:{port}"}

    def page_headers(self, content_type: str) -> list[tuple[str, str]]:
        return [
            ("Content-Type", content_type),
            ("Content-Security-Policy", csp([o for o in [self.media_origin()] if o])),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("X-Frame-Options", "DENY"),
            ("Cross-Origin-Opener-Policy", "same-origin"),
            ("Cache-Control", "no-cache"),
        ]

    def asset(self, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        name = "index.html" if path in ("/", "/index.html") else None
        m = _ASSET.match(path)
        if m:
            name = m[1]
        file = self.assets / name if name else None
        if file is None or file.suffix not in CONTENT_TYPES or not file.is_file():
            return 404, [("Content-Type", "text/plain; charset=utf-8")], b"not found\n"
        return 200, self.page_headers(CONTENT_TYPES[file.suffix]), file.read_bytes()

    def page_config(self, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        lower = {k.lower(): v for k, v in headers.items()}
        site = lower.get("sec-fetch-site")
        origin = lower.get("origin")
        own = {f"http://{h}" for h in self.own_hosts()}
        if (site is not None and site not in ("same-origin", "none")) or (origin is not None and origin not in own):
            body = json.dumps({"type": "about:blank", "title": "Forbidden", "status": 403,
                               "detail": "the console's configuration is served to the console's own page only"})
            return 403, [("Content-Type", "application/problem+json")], body.encode()
        conf = self.config()
        body = json.dumps({**conf, "media_origin": self.media_origin()}).encode()
        return 200, [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                     ("X-Content-Type-Options", "nosniff")], body

    def forward(self, method: str, path: str, headers: list[tuple[str, str]],
                body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Pass one request to the gateway unchanged (Host included) and return its answer."""
        up = urlsplit(self.upstream())
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in _HOP:
                    conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
            return resp.status, out, data
        except OSError as err:
            problem = {"type": "about:blank", "title": "Bad gateway", "status": 502,
                       "detail": f"the API gateway did not answer: {type(err).__name__}"}
            return 502, [("Content-Type", "application/problem+json")], json.dumps(problem).encode()
        finally:
            conn.close()

    def _request_class(self) -> type[BaseHTTPRequestHandler]:
        console = self

        class _Req(AnsweringHandler):

            def _any(self) -> None:
                path = self.path
                if self.headers.get("Host", "") not in console.own_hosts():
                    self.close_connection = True
                    self._answer(421, [("Content-Type", "text/plain; charset=utf-8")],
                                 b"this server answers for its own loopback address only\n", close=True)
                    return
                if path.startswith("/v1/") or path == "/v1":
                    try:
                        length = body_length(self.headers.items())
                    except GpufleetError as err:  # refused before reading, as the gateway would
                        self._answer(*problem_response(err, path), close=True)
                        return
                    body = self.rfile.read(length) if length else b""
                    self._answer(*console.forward(self.command, path, list(self.headers.items()), body))
                    return
                if self.command not in ("GET", "HEAD"):
                    self._answer(405, [("Content-Type", "text/plain; charset=utf-8"), ("Allow", "GET, HEAD")],
                                 b"method not allowed\n")
                    return
                if urlsplit(path).path == "/console/config.json":
                    self._answer(*console.page_config(dict(self.headers.items())))
                    return
                self._answer(*console.asset(urlsplit(path).path))

        return _Req

