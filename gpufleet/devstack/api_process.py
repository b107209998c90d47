"""The dev stack's API front door in a process of its own: the gateway and the handlers behind it never share
an interpreter lock with the stack's background work.

Why: the stack process runs moto, the Step Functions interpreter of every execution, the stream, queue and
event deliveries, the task Lambdas and the prompt encoder. Answering an API request in that process (SigV4,
Powertools, pydantic, botocore on both ends) competed with all of it for one interpreter lock, and at a few
submissions a second requests queued behind each other (docs/benchmarks.md, "Embedded stack"). On AWS, API
Gateway and the API Lambda never share an interpreter with Step Functions either. Here the API process talks to
moto over HTTP as before, and its moto requests stay foreground (:func:`gpufleet.local.foreground.tag_client`).

Contract:

- :class:`ApiProcess` is a :class:`gpufleet.devstack.supervisor.Component`. :meth:`ApiProcess.start` runs
  ``processes`` times ``python -m gpufleet.devstack.api_process`` (its own session: a terminal's Ctrl-C reaches the
  stack, which stops it last, after the agents drained through it), each with one end of a socket pair, sends
  each an :class:`ApiSpec`, and waits (``ready_timeout_s`` in all) until each listens; their output goes to this
  process's stdout/stderr (the stack log). With more than one, all listen on the first one's port
  (``SO_REUSEPORT``: the kernel spreads connections over them), so requests on different connections are
  answered concurrently, each process still one handler call at a time. :attr:`ApiProcess.url` is the gateway's
  base URL; :attr:`ApiProcess.pids` the processes. A failed start stops those already started.
- The child serves :class:`gpufleet.devstack.gateway.Gateway` (SigV4, one handler call at a time) in front of
  :func:`build_route` (``ApiSpec.factory``): the API, the provenance lookup (``POST /v1/provenance/lookup``), the
  node API (``/v1/node/``), the administration API (``/v1/admin/<resource>``) and ``POST /v1/nodes`` (the deployed registration function, invoked on moto), each configured from its
  deployed function's environment, every moto request foreground.
- The control channel is newline-delimited JSON on the socket pair. Child → parent: ``{"ready": url}`` or
  ``{"error": text}`` once; ``{"fg": 1}`` / ``{"fg": -1}`` as each request's foreground section opens and
  closes (the parent holds its :class:`~gpufleet.local.foreground.ForegroundGate` open meanwhile:
  :meth:`~gpufleet.local.foreground.ForegroundGate.hold`); ``{"resolve": key, "id": n}`` for an access key the
  child does not know (the parent answers ``{"id": n, "cred": ...}``, a :class:`LocalCredential` or null, from
  ``resolve``: the STS sessions of the parent's moto). Parent → child: ``{"add": cred, "id": n}``
  (:meth:`ApiProcess.add_credential`, sent to every process and answered ``{"ack": n}`` once the key is
  accepted). When the child's end
  closes (it exited), the sections it had open are released.
- Lifetime: the child exits when the channel reaches end of file, which the kernel causes whenever the
  parent dies (SIGKILL included; the parent's end is never inherited by other children); when the parent started
  it from its main thread it also has ``PR_SET_PDEATHSIG`` = SIGKILL. :meth:`ApiProcess.stop` closes every
  channel and waits ``stop_timeout_s`` in all, then kills what is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpufleet.devstack.gateway import LocalCredential
from gpufleet.errors import ConfigError, TransientError

log = logging.getLogger("gpufleet.devstack")

class ApiSpec(BaseModel):
    """What the API process needs: where moto is, the deployed functions whose configuration it copies, and the
    gateway's settings."""

    model_config = ConfigDict(frozen=True)

    region: str
    endpoint_url: str
    port: int = 0
    credentials: list[LocalCredential]
    credentials_dir: str | None = None
    open_routes: list[tuple[str, str]] = []
    #: physical names of the deployed ``api``, ``provenance_lookup``, ``node_api``, ``admin_api`` and
    #: ``register_node`` functions
    functions: dict[str, str]
    #: the API's cursor secret when its function names none
    cursor_secret: str
    watermark_keys: str
    #: the node API's gang silence unless its function sets ``GPUFLEET_GANG_SILENCE_S``
    gang_silence_s: str
    #: ``ADMIN_RESOURCES`` path prefixes under ``/v1/admin/`` routed to the administration API
    admin_resources: list[str]
    pdeathsig: bool = True
    #: bind the port with SO_REUSEPORT (several API processes share it)
    share_port: bool = False
    #: ``module:function`` that builds the proxy handler from this spec in the child (:func:`build_route`)
    factory: str = "gpufleet.devstack.api_process:build_route"


# --------------------------------------------------------------------------------------------- the child


def build_route(spec: ApiSpec) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The API Gateway resources (infra/api.py) as one proxy handler, every moto request foreground."""
    from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
    from gpufleet.api.app import LOOKUP_ROUTE
    from gpufleet.api.settings import ApiSettings
    from gpufleet.api.wiring import build_api, build_lookup_api
    from gpufleet.clock import SystemClock
    from gpufleet.local.foreground import tag_client
    from gpufleet.nodeapi.settings import NodeApiSettings
    from gpufleet.nodeapi.settings import build_api as build_node_api
    from gpufleet.store.clients import client as make_client

    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    made: dict[str, Any] = {}
    calls = threading.local()  # per request: moto calls and their wall time (the request log line)

    def before(**_: Any) -> None:
        calls.t0 = time.monotonic()

    def after(**_: Any) -> None:
        calls.n = getattr(calls, "n", 0) + 1
        calls.s = getattr(calls, "s", 0.0) + time.monotonic() - getattr(calls, "t0", time.monotonic())

    def fg(service: str) -> Any:
        if service not in made:
            extra = {"signature_version": "s3v4"} if service == "s3" else {}
            c = tag_client(make_client(service, region=spec.region, endpoint_url=spec.endpoint_url,
                                       credentials=creds, **extra))
            c.meta.events.register("before-call.*", before)
            c.meta.events.register("after-call.*", after)
            made[service] = c
        return made[service]

    def variables(key: str) -> dict[str, str]:
        conf = fg("lambda").get_function_configuration(FunctionName=spec.functions[key])
        return dict((conf.get("Environment") or {}).get("Variables") or {})

    api_env = variables("api")
    secret = api_env.get("GPUFLEET_CURSOR_SECRET")
    if not secret and api_env.get("GPUFLEET_CURSOR_SECRET_ARN"):
        secret = fg("secretsmanager").get_secret_value(SecretId=api_env["GPUFLEET_CURSOR_SECRET_ARN"])["SecretString"]
    settings = ApiSettings.load(env=api_env, cursor_secret=secret or spec.cursor_secret)
    clock = SystemClock()
    api = build_api(settings, ddb=fg("dynamodb"), s3=fg("s3"), sfn=fg("stepfunctions"), batch=fg("batch"),
                    kms=fg("kms"), sqs=fg("sqs"), clock=clock).handle
    # the provenance lookup's own function; it detects with the development watermark key the runtime embeds with
    lookup_settings = ApiSettings.load(env=variables("provenance_lookup"), cursor_secret=spec.cursor_secret,
                                       watermark_keys_file=spec.watermark_keys)
    lookup = build_lookup_api(lookup_settings, ddb=fg("dynamodb"), s3=fg("s3"), secretsmanager=None,
                              clock=clock).handle
    node_env = {"GPUFLEET_GANG_SILENCE_S": spec.gang_silence_s, **variables("node_api")}
    node_api = build_node_api(NodeApiSettings.load(env=node_env), dynamodb=fg("dynamodb"),
                              stepfunctions=fg("stepfunctions"), sts=fg("sts"), clock=clock,
                              events=fg("events")).handle
    admin_api = build_admin_api(AdminApiSettings.load(env=variables("admin_api")), dynamodb=fg("dynamodb"),
                                clock=clock, s3=fg("s3")).handle
    admin_prefixes = tuple(f"/v1/admin/{r}" for r in spec.admin_resources)
    register = spec.functions["register_node"]

    def register_node(event: dict[str, Any]) -> Any:
        resp = fg("lambda").invoke(FunctionName=register, Payload=json.dumps(event).encode())
        body = json.loads(resp["Payload"].read() or b"null")
        if resp.get("FunctionError"):  # the gateway answers 502, as API Gateway does for a failed integration
            raise RuntimeError(f"register_node failed: {body}")
        return body

    def route(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        calls.n, calls.s = 0, 0.0
        t0, cpu0 = time.monotonic(), time.thread_time()
        status: Any = "error"
        try:
            resp = dispatch(event, context)
            status = resp.get("statusCode") if isinstance(resp, dict) else "?"
            return resp
        finally:
            log.info("%s %s -> %s in %.0f ms (moto %.0f ms in %d calls; cpu %.0f ms)", event.get("httpMethod"),
                     event.get("path"), status, 1000 * (time.monotonic() - t0), 1000 * calls.s, calls.n,
                     1000 * (time.thread_time() - cpu0))

    def dispatch(event: dict[str, Any], context: Any) -> dict[str, Any]:
        path = event.get("path") or ""
        if path.startswith("/v1/node/"):
            return node_api(event, context)
        if path.startswith(admin_prefixes):
            return admin_api(event, context)
        if path == "/v1/nodes" and event.get("httpMethod") == "POST":  # the deployed registration function
            return register_node(event)
        if (event.get("httpMethod"), path) == LOOKUP_ROUTE:
            return lookup(event, context)
        return api(event, context)

    return route


class _ChildChannel:
    """The child's end of the control channel (see the module contract)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self.book: Any = None

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            self.sock.sendall(data)

    def read_spec(self) -> ApiSpec:
        line = self.reader.readline()
        if not line:
            os._exit(0)
        return ApiSpec.model_validate_json(line)

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        self.send({"fg": 1})
        try:
            yield
        finally:
            self.send({"fg": -1})

    def resolve(self, key: str) -> LocalCredential | None:
        event, box = threading.Event(), []
        with self._send_lock:
            self._next += 1
            ident = self._next
            self._waiting[ident] = (event, box)
        self.send({"resolve": key, "id": ident})
        found = event.wait(10.0)
        self._waiting.pop(ident, None)
        return LocalCredential.model_validate(box[0]) if found and box and box[0] else None

    def serve(self) -> None:
        """Read the parent's messages until end of file, then end the process (the parent is gone or stopping)."""
        for line in self.reader:
            message = json.loads(line)
            if "add" in message:
                cred = LocalCredential.model_validate(message["add"])
                self.book[cred.access_key_id] = cred
                self.send({"ack": message["id"]})
            elif "id" in message and message["id"] in self._waiting:
                event, box = self._waiting[message["id"]]
                box.append(message.get("cred"))
                event.set()
        os._exit(0)


def _set_parent_death_signal() -> None:
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def child_main(fd: int) -> None:
    """The API process (``python -m gpufleet.devstack.api_process FD``, ``FD`` its end of the channel)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stack stops it, after the agents drained through it
    sock = socket.socket(fileno=fd)
    channel = _ChildChannel(sock)
    spec = channel.read_spec()
    if spec.pdeathsig:
        _set_parent_death_signal()
        if os.getppid() == 1:
            os._exit(0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s api-process %(name)s %(message)s")
    for noisy in ("botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from gpufleet.devstack.gateway import Gateway

        module, _, function = spec.factory.partition(":")
        handler = getattr(importlib.import_module(module), function)(spec)
        gateway = Gateway(lambda: handler, spec.credentials, region=spec.region, port=spec.port,
                          credentials_dir=Path(spec.credentials_dir) if spec.credentials_dir else None,
                          open_routes=[tuple(r) for r in spec.open_routes], resolve=channel.resolve,
                          foreground=channel.foreground, share_port=spec.share_port)
        channel.book = gateway.credentials
        gateway.start()
    except OSError as err:
        channel.send({"error": f"cannot listen on 127.0.0.1:{spec.port}: {err.strerror} (try --port 0)"})
        os._exit(1)
    except Exception as err:  # reported to the parent, which fails the stack's start with it
        log.exception("the API process did not start")
        channel.send({"error": f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"})
        os._exit(1)
    channel.send({"ready": gateway.url})
    channel.serve()


# --------------------------------------------------------------------------------------------- the parent


class _Child:
    """One API process and the parent's end of its channel."""

    def __init__(self, owner: ApiProcess, spec: ApiSpec) -> None:
        self.owner = owner
        parent, child = socket.socketpair()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet.devstack.api_process", str(child.fileno())],
                                         pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            child.close()
        self.sock: socket.socket | None = parent
        self._send_lock = threading.Lock()
        self.url: str | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.acks: dict[int, threading.Event] = {}
        #: foreground sections this child has open now (released if it dies)
        self.open_sections = 0
        self.reader = threading.Thread(target=self._read, name="gpufleet-api-process", daemon=True)
        self.reader.start()
        self.send(spec.model_dump(mode="json"))

    def wait_ready(self, deadline: float) -> str:
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
        if self.url is None:
            raise TransientError(self.error or (f"exited with code {self.proc.returncode}" if self.proc.poll() is not None
                                                else "not ready in time"))
        return self.url

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            if self.sock is None:
                raise TransientError("the API process is not running")
            self.sock.sendall(data)

    def _read(self) -> None:
        gate, sock = self.owner.gate, self.sock
        try:
            for line in sock.makefile("rb"):
                message = json.loads(line)
                fg = message.get("fg")
                if fg is not None:
                    if gate is not None:
                        gate.hold() if fg > 0 else gate.release()
                    self.open_sections += fg
                    self.owner.sections += fg > 0
                elif "resolve" in message:
                    resolve = self.owner.resolve
                    cred = resolve(message["resolve"]) if resolve is not None else None
                    self.send({"id": message["id"], "cred": cred.model_dump(mode="json") if cred else None})
                elif "ack" in message:
                    event = self.acks.pop(message["ack"], None)
                    if event is not None:
                        event.set()
                elif "ready" in message:
                    self.url = message["ready"]
                    self.ready.set()
                elif "error" in message:
                    self.error = message["error"]
                    self.ready.set()
        except (OSError, ValueError) as err:
            log.warning("API process channel: %s", err)
        finally:
            if gate is not None and self.open_sections > 0:
                gate.release(self.open_sections)
            self.open_sections = 0
            self.ready.set()

    def close(self) -> None:
        with self._send_lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def wait(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("API process %d did not exit within %.0fs; killing it", self.proc.pid, timeout_s)
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(5)


class ApiProcess:
    """The SigV4-verifying gateway on 127.0.0.1 in front of the API handlers, in ``processes`` processes of their
    own sharing one port (see the module contract). ``spec`` is called at start (the template is deployed by then);
    ``gate`` is held open while a child answers a request; ``resolve`` answers the children's unknown access keys."""

    name = "API gateway"

    def __init__(self, spec: Callable[[], ApiSpec], *, gate: Any = None,
                 resolve: Callable[[str], LocalCredential | None] | None = None, processes: int = 1,
                 ready_timeout_s: float = 120.0, stop_timeout_s: float = 5.0) -> None:
        if processes < 1:
            raise ConfigError("the API needs at least one process")
        self.spec = spec
        self.gate = gate
        self.resolve = resolve
        self.processes = processes
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.children: list[_Child] = []
        self._url: str | None = None
        self._ids = iter(range(1, 1 << 62))
        self._ids_lock = threading.Lock()
        #: foreground sections the children opened so far
        self.sections = 0

    @property
    def pid(self) -> int | None:
        """The first API process's pid (:attr:`pids`: every one)."""
        return self.children[0].proc.pid if self.children else None

    @property
    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children]

    def start(self) -> None:
        spec = self.spec()
        if spec.pdeathsig and threading.current_thread() is not threading.main_thread():
            spec = spec.model_copy(update={"pdeathsig": False})  # the signal follows the thread that spawned it
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            first = _Child(self, spec.model_copy(update={"share_port": self.processes > 1}))
            self.children.append(first)
            url = first.wait_ready(deadline)
            port = int(url.rsplit(":", 1)[1])
            rest = [_Child(self, spec.model_copy(update={"share_port": True, "port": port}))
                    for _ in range(self.processes - 1)]
            self.children += rest
            for child in rest:
                child.wait_ready(deadline)
        except TransientError as err:
            self.stop()
            if "cannot listen" in str(err):
                raise ConfigError(str(err)) from None
            raise TransientError(f"the API process did not start: {err}") from None
        self._url = url

    @property
    def url(self) -> str:
        if self._url is None:
            raise ConfigError("the gateway is not started")
        return self._url

    @property
    def open_sections(self) -> int:
        return sum(c.open_sections for c in self.children)

    def add_credential(self, cred: LocalCredential, timeout_s: float = 10.0) -> None:
        """Have every API process accept ``cred`` (returns once each does)."""
        waits = []
        for child in self.children:
            with self._ids_lock:
                ident = next(self._ids)
            done = child.acks[ident] = threading.Event()
            child.send({"add": cred.model_dump(mode="json"), "id": ident})
            waits.append(done)
        deadline = time.monotonic() + timeout_s
        if not all(w.wait(max(0.0, deadline - time.monotonic())) for w in waits):
            raise TransientError(f"the API process did not take access key {cred.access_key_id}")

    def stop(self) -> None:
        for child in self.children:
            child.close()
        deadline = time.monotonic() + self.stop_timeout_s
        for child in self.children:
            child.wait(max(0.0, deadline - time.monotonic()))
        self.children = []
        self._url = None

    def describe(self) -> dict[str, str]:
        pids = ", ".join(str(p) for p in self.pids)
        return {"API (SigV4)": f"{self.url} (process{'es' if len(self.pids) > 1 else ''} {pids})"}


if __name__ == "__main__":
    child_main(int(sys.argv[1]))
