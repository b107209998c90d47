"""Fixtures of the lifecycle e2e suite: one moto world per worker process with the lifecycle deployed
(the real template through gpufleet.local.harness when present, else lifecycle_stack.deploy), the
fleet around it (lifecycle_fleet.Fleet) and a loopback webhook receiver."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

NODES = ["node-1", "node-2", "node-3"]


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


def _warm_prompt_filter() -> threading.Thread:
    """Load the real CheckPrompt model (gpufleet.safety.PromptFilter.default(): MiniLM, ~25 s on the
    shared 2-core machine, once per process) in the background while the stack deploys."""

    def load() -> None:
        from gpufleet.safety import PromptFilter

        PromptFilter.default()

    thread = threading.Thread(target=load, name="prompt-filter-warmup", daemon=True)
    thread.start()
    return thread


def _harness_available() -> bool:
    """The harness deploys the whole template; ``GPUFLEET_E2E_STACK=lifecycle`` forces the lifecycle-only stack."""
    if os.environ.get("GPUFLEET_E2E_STACK") == "lifecycle":
        return False
    return importlib.util.find_spec("gpufleet.local.harness") is not None


@pytest.fixture(scope="module")
def lifecycle():
    import lifecycle_fleet
    import lifecycle_stack

    from lambdas.tasks import _deps

    warming = _warm_prompt_filter()
    holder: dict = {}
    with _deployed(lifecycle_stack, lambda job: holder["fleet"].batch_runner(job)) as stack:
        fleet = holder["fleet"] = lifecycle_fleet.Fleet(stack)
        # CheckPrompt is the real PromptFilter and quota release the real scheduler store's (the
        # default Deps.prompt_check and Deps.release); only events are off (no EventBridge consumers).
        _deps.override(events=None)
        _put_quotas(stack)
        warming.join()
        fleet.start()
        receiver = Receiver()
        try:
            yield {"stack": stack, "fleet": fleet, "receiver": receiver, "tables": stack.tables}
        finally:
            receiver.close()
            fleet.stop()
            _deps.reset()


#: quota tree of the suite's tenant (milli-GPU): room for every scenario
QUOTA_PATHS = ("acme", "acme/vision", "acme/vision/ana", "acme/vision/hana")


def _put_quotas(stack) -> None:
    from gpufleet.scheduler.model import QuotaNode
    from gpufleet.scheduler.store import put_quota

    for path in QUOTA_PATHS:
        put_quota(stack.c("dynamodb"), stack.tables.control,
                  QuotaNode(path=path, guarantee={"*": 8000}, borrow_limit={"*": 8000}))


class _deployed:
    """Deploy through the harness when it exists, else through lifecycle_stack (see its docstring)."""

    def __init__(self, lifecycle_stack, runner) -> None:
        self.ls, self.runner = lifecycle_stack, runner
        self.harness = self.mock = self.undo = None

    def __enter__(self):
        if _harness_available():
            from gpufleet.local.harness import LocalStack

            self.harness = LocalStack(batch_executor=self.runner).__enter__()
            return self.ls.from_harness(self.harness, NODES)
        from moto import mock_aws

        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
            os.environ.setdefault(k, v)
        self.mock = mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "batch": {"use_docker": False}})
        self.mock.start()
        self.undo = self.ls.install_patches(self.runner)
        return self.ls.deploy(NODES)

    def __exit__(self, *exc):
        if self.harness is not None:
            self.harness.__exit__(*exc)
        else:
            self.undo()
            self.mock.stop()
