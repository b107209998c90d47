"""The node API over HTTP: an API Gateway (REST, ``AWS_IAM``) Lambda proxy handler.

Routes (all under ``/v1/node``; JSON bodies; answers JSON or problem+json):

| method, path | body | does |
|---|---|---|
| ``GET /v1/node/self`` | | the caller's registration (``gpufleet agent --check``) |
| ``POST /v1/node/heartbeat`` | :class:`~gpufleet.nodeapi.liveness.LivenessReport` | the node's liveness item |
| ``POST /v1/node/jobs/{job}/attempts/{epoch}/{op}`` | per op, below | :class:`~gpufleet.nodeapi.service.NodeService` |

``op``: ``view``, ``heartbeat`` (the task heartbeat; answers the job view), ``beat`` (runtime heartbeat),
``progress`` {step, total}, ``running``, ``checkpoint`` {key, sha256, step}, ``generated`` {key, sha256, files?},
``staging`` {staging}, ``phases`` {phases}, ``event`` {kind, detail}, ``credentials``, ``complete`` {gpu_seconds},
``fail`` {error, detail}.

``POST /v1/node/cloud/credentials`` {job_id, epoch, token}: a cloud attempt's supervisor exchanges its one-time
token for its session (:mod:`gpufleet.nodeapi.supervisor`); the one route that needs no IAM caller (the token is
the credential; API Gateway serves it without ``AWS_IAM``). A supervisor session then calls the attempt routes of
its own attempt only.

The routes are three tables, the only thing :meth:`NodeApi.handle` dispatches on (:func:`routes` lists them):
:data:`OPEN_ROUTES`, :data:`NODE_ROUTES` (the caller's own registration and liveness) and :data:`OPS` (the
attempt ops).

The node is the caller's IAM principal (:func:`gpufleet.nodeapi.identity.node_of`), never a field of
the request. Refusals: 403 ``not-allowed`` (not a node, not its attempt, not registered), 409
``stale-epoch`` (an older attempt), 410 ``task-gone``, 400 ``validation``; nothing is changed by a
refused call.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.errors import GpufleetError, NotFound, NotRegistered, ValidationFailed
from gpufleet.metrics import catalog as M
from gpufleet.nodeapi.identity import caller_of
from gpufleet.nodeapi.liveness import LivenessReport
from gpufleet.nodeapi.service import NodeService
from gpufleet.store.dynamo import marshal_value

log = logging.getLogger("gpufleet.nodeapi")

PREFIX = "/v1/node"
_ATTEMPT = re.compile(r"^/v1/node/jobs/(?P<job>[A-Za-z0-9_.-]{1,128})/attempts/(?P<epoch>\d{1,9})/(?P<op>[a-z]+)$")
MAX_BODY = 256 * 1024
#: the refusals counted in ``NodeCallsRefused`` (a caller's own mistakes, 400/404, are not)
REFUSALS = frozenset({403, 409, 410})
#: how deep a body may nest (DynamoDB holds documents 32 levels deep, the item's own levels included)
MAX_DEPTH = 16
#: the supervisor-token exchange (no IAM auth)
EXCHANGE_PATH = f"{PREFIX}/cloud/credentials"
#: the attempt routes' path template (``{job}``, ``{epoch}``, ``{op}``: :data:`_ATTEMPT`)
ATTEMPT_PATH = PREFIX + "/jobs/{job}/attempts/{epoch}/{op}"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Progress(_Body):
    step: int = Field(ge=0)
    total: int = Field(ge=0)


class Checkpoint(_Body):
    key: str = Field(max_length=1024)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    step: int = Field(ge=0)


class Generated(_Body):
    key: str = Field(max_length=1024)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    files: int | None = Field(None, ge=0, description="a container job's output file count (key is a prefix)")


class Staging(_Body):
    staging: dict[str, Any]


class Phases(_Body):
    phases: dict[str, Any]


class Event(_Body):
    kind: str = Field(max_length=64)
    detail: dict[str, Any] = Field(default_factory=dict)


class Complete(_Body):
    gpu_seconds: float = Field(0.0, ge=0)


class Fail(_Body):
    error: str = Field(max_length=64)
    detail: str = Field("", max_length=8000)


class _Empty(_Body):
    pass


class SupervisorExchange(_Body):
    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    epoch: int = Field(ge=0, le=999_999_999)
    token: str = Field(min_length=16, max_length=256)


#: the attempt routes, ``POST`` :data:`ATTEMPT_PATH`: op -> (body, call(service, node, job, epoch, body))
OPS: dict[str, tuple[type[BaseModel], Callable[..., dict[str, Any]]]] = {
    "view": (_Empty, lambda s, n, j, e, b: s.view(n, j, e)),
    "heartbeat": (_Empty, lambda s, n, j, e, b: s.task_heartbeat(n, j, e)),
    "beat": (_Empty, lambda s, n, j, e, b: s.beat(n, j, e)),
    "progress": (Progress, lambda s, n, j, e, b: s.progress(n, j, e, b.step, b.total)),
    "running": (_Empty, lambda s, n, j, e, b: s.mark_running(n, j, e)),
    "checkpoint": (Checkpoint, lambda s, n, j, e, b: s.checkpoint(n, j, e, b.key, b.sha256, b.step)),
    "generated": (Generated, lambda s, n, j, e, b: s.generated(n, j, e, b.key, b.sha256, b.files)),
    "staging": (Staging, lambda s, n, j, e, b: s.staging(n, j, e, b.staging)),
    "phases": (Phases, lambda s, n, j, e, b: s.phases(n, j, e, b.phases)),
    "event": (Event, lambda s, n, j, e, b: s.event(n, j, e, b.kind, b.detail)),
    "credentials": (_Empty, lambda s, n, j, e, b: s.credentials(n, j, e)),
    "complete": (Complete, lambda s, n, j, e, b: s.complete(n, j, e, b.gpu_seconds)),
    "fail": (Fail, lambda s, n, j, e, b: s.fail(n, j, e, b.error, b.detail)),
}
#: the routes whose only subject is the calling node: (method, path) -> (body, None: not read; call(service, node, body))
NODE_ROUTES: dict[tuple[str, str], tuple[type[BaseModel] | None, Callable[..., dict[str, Any]]]] = {
    ("GET", f"{PREFIX}/self"): (None, lambda s, n, b: s.registration(n)),
    ("POST", f"{PREFIX}/heartbeat"): (LivenessReport, lambda s, n, b: s.node_heartbeat(n, b)),
}
#: the routes with no IAM caller (the body carries the credential): (method, path) -> (body, call(service, body))
OPEN_ROUTES: dict[tuple[str, str], tuple[type[BaseModel], Callable[..., dict[str, Any]]]] = {
    ("POST", EXCHANGE_PATH): (SupervisorExchange, lambda s, b: s.exchange_supervisor_token(b.job_id, b.epoch, b.token)),
}


def routes() -> list[tuple[str, str]]:
    """Every (method, path) the node API serves, the attempt routes as :data:`ATTEMPT_PATH` with their op: the
    tables :meth:`NodeApi.handle` dispatches on, and nothing else (a route is added by adding it to a table)."""
    return [*OPEN_ROUTES, *NODE_ROUTES, *(("POST", ATTEMPT_PATH.replace("{op}", op)) for op in OPS)]


def _response(status: int, body: dict[str, Any], problem: bool = False) -> dict[str, Any]:
    ctype = "application/problem+json" if problem else "application/json"
    return {"statusCode": status, "headers": {"content-type": ctype}, "body": json.dumps(body, default=str)}


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _parse(model: type[BaseModel], raw: str | None) -> BaseModel:
    """The body as ``model``; a 400 unless the store could write every value of it as it is (DynamoDB's numbers:
    finite, at most 38 digits, within 1e-130..1e126; at most :data:`MAX_DEPTH` levels), never a failed write (5xx)."""
    if raw and len(raw) > MAX_BODY:
        raise ValidationFailed("body too large")
    try:
        body = model.model_validate_json(raw or "{}")
    except ValidationError as err:
        raise ValidationFailed(f"invalid body: {err.errors(include_url=False, include_input=False)}")
    doc = body.model_dump()
    if _depth(doc) > MAX_DEPTH:
        raise ValidationFailed(f"invalid body: nested deeper than {MAX_DEPTH} levels")
    try:
        marshal_value(doc)
    except (TypeError, ArithmeticError) as err:  # NaN, infinities; decimal's Rounded, Overflow, Underflow, ...
        raise ValidationFailed(f"invalid body: a number the store cannot hold ({type(err).__name__})") from err
    return body


class NodeApi:
    """``handle(event, context)`` is the Lambda proxy handler; ``agent_roles`` name the agent role."""

    def __init__(self, service: NodeService, agent_roles: Collection[str],
                 supervisor_roles: Collection[str] = ()) -> None:
        self.service = service
        self.agent_roles = frozenset(agent_roles)
        self.supervisor_roles = frozenset(supervisor_roles)

    def handle(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        path = event.get("path") or ""
        method = (event.get("httpMethod") or "").upper()
        node = None
        try:
            if (method, path) in OPEN_ROUTES:  # no IAM caller: the token is the credential
                model, call = OPEN_ROUTES[(method, path)]
                result = call(self.service, _parse(model, event.get("body")))
            else:
                identity = ((event.get("requestContext") or {}).get("identity")) or {}
                node = caller_of(identity.get("userArn"), self.agent_roles, self.supervisor_roles)
                result = self._route(node, method, path, event.get("body"))
        except GpufleetError as err:
            if err.status >= 500:
                log.warning("node API call failed", extra={"path": path, "status": err.status})
            elif node is not None and err.status in REFUSALS:
                self._refused(node, method, path, err)
            return _response(err.status, err.problem(path), problem=True)
        return _response(200, result)

    def _refused(self, node: str, method: str, path: str, err: GpufleetError) -> None:
        """A node's (or supervisor's) refused call: ``NodeCallsRefused`` by reason, and a line naming the caller —
        an ``unregistered`` caller is a key the fleet no longer lists (deregistered) still in use."""
        reason = "unregistered" if isinstance(err, NotRegistered) else err.type_slug
        metrics = self.service.d.metrics
        metrics.put(M.NODE_CALLS_REFUSED, 1, {M.REASON: reason})
        metrics.log("node_call_refused", {"node": node, "reason": reason, "method": method, "path": path})

    def _route(self, node: str, method: str, path: str, body: str | None) -> dict[str, Any]:
        if (method, path) in NODE_ROUTES:
            model, call = NODE_ROUTES[(method, path)]
            return call(self.service, node, _parse(model, body) if model is not None else None)
        m = _ATTEMPT.match(path)
        if m and method == "POST" and m["op"] in OPS:
            model, call = OPS[m["op"]]
            return call(self.service, node, m["job"], int(m["epoch"]), _parse(model, body))
        raise NotFound(f"no node API route {method} {path}")
