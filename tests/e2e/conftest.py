"""Fixtures of the lifecycle e2e suite: one moto world per worker process with the synthesized
state machine deployed (see lifecycle_stack.py), the fleet around it, and a loopback webhook receiver."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

for _k, _v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ[_k] = _v


class Receiver:
    """A loopback HTTP server recording webhook POSTs."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append({"headers": dict(self.headers.items()), "body": body})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def for_job(self, job_id: str) -> list[dict]:
        return [r for r in self.received if json.loads(r["body"])["data"]["job_id"] == job_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Stand-in for gpufleet.safety.PromptFilter until it lands: a fixed phrase is unsafe.
BLOCKED_PHRASE = "graphic violence against"


def _prompt_check(text: str) -> dict:
    blocked = BLOCKED_PHRASE in text.lower()
    return {"allowed": not blocked, "reason": "violence" if blocked else None}


@pytest.fixture(scope="module")
def lifecycle():
    import lifecycle_fleet
    import lifecycle_stack
    from moto import mock_aws

    mock = mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "batch": {"use_docker": False}})
    mock.start()
    fleet = None
    undo = lifecycle_stack.install_patches(lambda job: fleet.batch_runner(job))
    try:
        stack = lifecycle_stack.deploy(["node-1", "node-2", "node-3"])
        fleet = lifecycle_fleet.Fleet(stack)
        from lambdas.tasks import _deps

        _deps.deps.cache_clear()
        deps = _deps.deps()
        deps.release = fleet.release
        deps.prompt_check = _prompt_check
        fleet.start()
        receiver = Receiver()
        yield {"stack": stack, "fleet": fleet, "receiver": receiver, "deps": deps}
        receiver.close()
        fleet.stop()
    finally:
        undo()
        mock.stop()
