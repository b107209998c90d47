"""The supervisor's task-metadata reader over HTTP (a loopback stand-in for ECS's v4 endpoint)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpufleet.runtime.taskmeta import MetadataUnavailable, TenantWatch, endpoint_fetch

TASK = {
    "Containers": [
        {"Name": "supervisor", "KnownStatus": "RUNNING"},
        {"Name": "tenant", "KnownStatus": "STOPPED", "ExitCode": 0},
    ]
}


def test_endpoint_fetch_reads_the_task_document_over_http(monkeypatch):
    body = json.dumps(TASK).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/v4/abc/task" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", f"http://127.0.0.1:{server.server_address[1]}/v4/abc")
        assert TenantWatch(endpoint_fetch()).wait() == 0
    finally:
        server.shutdown()
    monkeypatch.delenv("ECS_CONTAINER_METADATA_URI_V4")
    with pytest.raises(MetadataUnavailable, match="not set"):
        endpoint_fetch()
