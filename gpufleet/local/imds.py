"""A loopback EC2 instance metadata service (IMDSv2) for rehearsing spot interruptions locally.

Contract:
- ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` issues a session token
  (400 without the header), as IMDSv2 does.
- ``GET /latest/meta-data/spot/instance-action`` with a valid token answers 404 until
  :meth:`LocalImds.interrupt` arms a notice, then the notice's JSON (``{"action", "time"}``)
  until :meth:`LocalImds.clear`; a missing or unknown token gets 401.
- Binds 127.0.0.1 only (port 0 picks a free one); :attr:`endpoint` is what a runtime's
  ``GPUFLEET_IMDS_ENDPOINT`` (or ``gpufleet dev --imds-endpoint``) takes. Counters record tokens
  issued, notices served and unauthorised requests.
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"


class LocalImds:
    """The metadata service; use as a context manager (starts a daemon thread, stops on exit)."""

    def __init__(self, port: int = 0) -> None:
        self.action: dict | None = None
        self.tokens: set[str] = set()
        self.notices_served = 0
        self.unauthorised = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="local-imds", daemon=True)

    def interrupt(self, action: str = "terminate", in_s: float = 120.0) -> None:
        """Arm a spot interruption notice: ``action`` at now + ``in_s`` (AWS gives two minutes)."""
        when = (datetime.now(UTC) + timedelta(seconds=in_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._lock:
            self.action = {"action": action, "time": when}

    def clear(self) -> None:
        with self._lock:
            self.action = None

    def __enter__(self) -> LocalImds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _reply(self, code: int, body: bytes = b"", content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:  # noqa: N802 - http.server API
                if self.path != TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(400)
                    return
                token = secrets.token_urlsafe(24)
                with imds._lock:
                    imds.tokens.add(token)
                self._reply(200, token.encode())

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                with imds._lock:
                    known = self.headers.get("X-aws-ec2-metadata-token") in imds.tokens
                    action = imds.action
                    if not known:
                        imds.unauthorised += 1
                    elif self.path == ACTION_PATH and action is not None:
                        imds.notices_served += 1
                if not known:
                    self._reply(401)
                elif self.path != ACTION_PATH or action is None:
                    self._reply(404)
                else:
                    self._reply(200, json.dumps(action).encode(), "application/json")

        return Handler
