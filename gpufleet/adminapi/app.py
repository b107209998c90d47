"""The administration API Lambda app (``/v1/admin/...`` on the REST API, ``AWS_IAM``): operators only.

Contract:
- Two gates: API Gateway admits only callers whose IAM policy allows ``execute-api:Invoke`` on
  ``/v1/admin/*`` (the admin policy of the CDK app, infra/admin.py), and every route resolves the caller's
  principal (``requestContext.identity.userArn``, :func:`gpufleet.store.principals.resolve`) and refuses
  anyone not registered with ``admin: true`` (403 ``not-allowed``) before anything is read or written.
  The check is this server's, never the client's.
- Routes validate their input (pydantic, via Powertools) and call one
  :class:`gpufleet.adminapi.service.AdminService` method; every exception becomes an RFC 9457 problem
  through :func:`gpufleet.api.problems.to_problem` (bad input 400, unknown 404, conditional write lost 409).
- Request bodies pass :func:`gpufleet.api.body.check` (size, media type, strict JSON) first.

Routes (all JSON): tenants ``GET|POST /v1/admin/tenants``, ``GET|PATCH /v1/admin/tenants/{tenant}``; teams
``GET|POST /v1/admin/tenants/{tenant}/teams``; users ``GET|POST|DELETE /v1/admin/tenants/{tenant}/users``
(``DELETE ?arn=``); quota nodes ``GET|PUT /v1/admin/quota?path=tenant[/team[/user]]`` (``GET`` without ``path``: all, ``{items}``); safety profiles
``GET|PUT /v1/admin/tenants/{tenant}/safety-profile``; operators' reports on tier-1 prompt decisions
``GET /v1/admin/safety-reports``, ``GET|PUT /v1/admin/safety-reports/{job_id}``; pools ``GET /v1/admin/pools``,
``PUT|DELETE /v1/admin/pools/{name}``; the model catalog ``GET /v1/admin/models``,
``GET|PUT|DELETE /v1/admin/models/{name}``; nodes ``GET /v1/admin/nodes``, ``GET /v1/admin/nodes/{id}``,
``PUT /v1/admin/nodes/{id}/pool``, ``POST /v1/admin/nodes/{id}/drain|undrain``, ``DELETE /v1/admin/nodes/{id}``
(deregister; ``?force=true`` while it holds attempts); the audit log
``GET /v1/admin/audit?month=yyyy-mm&limit=``. Node registration stays ``POST /v1/nodes``.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from gpufleet.adminapi.models import (
    AdminDoc,
    AdminPage,
    ModelIn,
    NodeBindIn,
    PoolIn,
    QuotaIn,
    SafetyIn,
    SafetyReportIn,
    TeamIn,
    TenantIn,
    TenantPatch,
    UserIn,
)
from gpufleet.adminapi.service import AdminService
from gpufleet.api import body as request_body
from gpufleet.api.app import _RESOLVE_LOCK
from gpufleet.api.cors import cors
from gpufleet.api.models import Problem
from gpufleet.api.problems import PROBLEM_JSON, as_error, to_problem
from gpufleet.errors import GpufleetError, NotAllowed, NotFound
from gpufleet.store.principals import Principal

log = logging.getLogger("gpufleet.adminapi")
#: the resources this API serves under /v1/admin (API Gateway routes each to this Lambda, infra/api.py; the
#: operator's job recovery routes, /v1/admin/jobs and /v1/admin/quarantine, are the jobs API's)
ADMIN_RESOURCES = ("tenants", "quota", "pools", "nodes", "audit", "safety-reports", "models")
JSON = "application/json"
TENANT = Annotated[str, Path(max_length=63)]
JOB = Annotated[str, Path(max_length=64, description="job id (job_<ulid>)")]
NODE = Annotated[str, Path(max_length=64)]
MODEL = Annotated[str, Path(max_length=256, description="the name jobs give in workload.model")]
_ERRORS = {
    400: "Invalid input (problem type validation)",
    403: "Not an admin principal (problem type not-allowed) or bad signature",
    404: "No such tenant, team, user, quota node, pool, node or model (problem type not-found)",
    409: "Exists already, or another version (problem type conflict, with current_version), or a model's hash is not "
         "its published manifest's",
}


def _responses(code: int, model: type, errors: tuple[int, ...] = (400, 404)) -> dict[int, Any]:
    out: dict[int, Any] = {code: {"description": "OK", "content": {JSON: {"model": model}}}}
    for e in sorted({403, *errors}):
        out[e] = {"description": _ERRORS[e], "content": {PROBLEM_JSON: {"model": Problem}}}
    return out


class AdminApi:
    """``handle(event, context)`` is the Lambda proxy handler; ``resolve_principal(arn)`` maps a caller ARN to
    its :class:`Principal` (unknown: 403)."""

    def __init__(self, service: AdminService, resolve_principal, *, cors_origin: str = "") -> None:
        self.service = service
        self.resolve_principal = resolve_principal
        app = self.app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=request_body.loads,
                                                cors=cors(cors_origin))
        app.exception_handler(Exception)(self._problem)
        app.not_found(lambda _e: self._problem(NotFound(f"no admin route for {app.current_event.http_method} "
                                                         f"{app.current_event.path}")))
        self._routes()

    def _admin(self) -> Principal:
        arn = ((self.app.current_event.get("requestContext") or {}).get("identity") or {}).get("userArn")
        who = self.resolve_principal(arn)
        if not who.admin:
            raise NotAllowed("the administration API is for operators (admin principals) only")
        return who

    def _problem(self, exc: Exception) -> Response:
        err = as_error(exc)
        if err.status >= 500 and not isinstance(exc, GpufleetError):
            log.exception("unhandled error")
        status, headers, body = to_problem(err, instance=self.app.current_event.path)
        return Response(status_code=status, content_type=PROBLEM_JSON, body=body, headers=headers)

    @staticmethod
    def _json(status: int, body: Any) -> Response:
        return Response(status_code=status, content_type=JSON, body=json.dumps(body, default=str))

    def _routes(self) -> None:  # noqa: C901 - one closure per route, each thin
        app, svc = self.app, self.service
        tags = ["admin"]

        @app.get("/v1/admin/tenants", summary="List tenants", responses=_responses(200, AdminPage, ()), tags=tags)
        def list_tenants():
            self._admin()
            return self._json(200, {"items": svc.tenants()})

        @app.post("/v1/admin/tenants", summary="Onboard a tenant", responses=_responses(201, AdminDoc, (400, 409)),
                  tags=tags)
        def create_tenant(body: TenantIn):
            return self._json(201, svc.create_tenant(self._admin(), body))

        @app.get("/v1/admin/tenants/<tenant>", summary="A tenant", responses=_responses(200, AdminDoc), tags=tags)
        def get_tenant(tenant: TENANT):
            self._admin()
            return self._json(200, svc.tenant(tenant))

        @app.patch("/v1/admin/tenants/<tenant>", summary="Change a tenant's defaults",
                   responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def update_tenant(tenant: TENANT, body: TenantPatch):
            return self._json(200, svc.update_tenant(self._admin(), tenant, body))

        @app.get("/v1/admin/tenants/<tenant>/teams", summary="A tenant's teams",
                 responses=_responses(200, AdminPage), tags=tags)
        def list_teams(tenant: TENANT):
            self._admin()
            return self._json(200, {"items": svc.teams(tenant)})

        @app.post("/v1/admin/tenants/<tenant>/teams", summary="Create a team",
                  responses=_responses(201, AdminDoc, (400, 404, 409)), tags=tags)
        def create_team(tenant: TENANT, body: TeamIn):
            return self._json(201, svc.create_team(self._admin(), tenant, body))

        @app.get("/v1/admin/tenants/<tenant>/users", summary="A tenant's users (principal ARN → team/user)",
                 responses=_responses(200, AdminPage), tags=tags)
        def list_users(tenant: TENANT):
            self._admin()
            return self._json(200, {"items": svc.users(tenant)})

        @app.post("/v1/admin/tenants/<tenant>/users", summary="Map an IAM principal to a user of a team",
                  responses=_responses(201, AdminDoc, (400, 404, 409)), tags=tags)
        def add_user(tenant: TENANT, body: UserIn):
            return self._json(201, svc.add_user(self._admin(), tenant, body))

        @app.delete("/v1/admin/tenants/<tenant>/users", summary="Remove a user's principal",
                    responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def remove_user(tenant: TENANT, arn: Annotated[str, Query(max_length=600)]):
            return self._json(200, svc.remove_user(self._admin(), tenant, arn))

        @app.get("/v1/admin/quota", summary="A quota node; without path, every quota node ({items})",
                 responses=_responses(200, AdminDoc), tags=tags)
        def get_quota(path: Annotated[str | None, Query(max_length=200, description="tenant[/team[/user]]; "
                                                        "absent: list every node")] = None):
            self._admin()
            return self._json(200, svc.quota(path) if path is not None else {"items": svc.quotas()})

        @app.put("/v1/admin/quota", summary="Set a quota node (guarantee, borrowing limit, weight)",
                 responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def set_quota(path: Annotated[str, Query(max_length=200, description="tenant[/team[/user]]")], body: QuotaIn):
            return self._json(200, svc.set_quota(self._admin(), path, body))

        @app.get("/v1/admin/tenants/<tenant>/safety-profile", summary="A tenant's safety profile (null: default)",
                 responses=_responses(200, AdminDoc), tags=tags)
        def get_safety(tenant: TENANT):
            self._admin()
            return self._json(200, svc.safety(tenant))

        @app.put("/v1/admin/tenants/<tenant>/safety-profile", summary="Write a new version of a tenant's safety profile",
                 responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def set_safety(tenant: TENANT, body: SafetyIn):
            return self._json(200, svc.set_safety(self._admin(), tenant, body))

        @app.get("/v1/admin/safety-reports", summary="Operators' reports on tier-1 prompt decisions, oldest first",
                 responses=_responses(200, AdminPage, ()), tags=tags)
        def list_safety_reports():
            self._admin()
            return self._json(200, {"items": svc.safety_reports()})

        @app.get("/v1/admin/safety-reports/<job_id>", summary="The report on one job's prompt decision",
                 responses=_responses(200, AdminDoc), tags=tags)
        def get_safety_report(job_id: JOB):
            self._admin()
            return self._json(200, svc.safety_report(job_id))

        @app.put("/v1/admin/safety-reports/<job_id>",
                 summary="Report a job's prompt as unsafe (missed) or safe (wrongly blocked); relabel with the version",
                 responses=_responses(200, AdminDoc, (400, 409)), tags=tags)
        def report_safety(job_id: JOB, body: SafetyReportIn):
            return self._json(200, svc.report_safety(self._admin(), job_id, body))

        @app.get("/v1/admin/pools", summary="Pools: the deployment's, overlaid by operators' definitions",
                 responses=_responses(200, AdminPage, ()), tags=tags)
        def list_pools():
            self._admin()
            return self._json(200, {"items": svc.pools()})

        @app.put("/v1/admin/pools/<name>", summary="Add an on-prem pool or change a pool's capacity and prices",
                 responses=_responses(200, AdminDoc, (400, 409)), tags=tags)
        def put_pool(name: Annotated[str, Path(max_length=64)], body: PoolIn):
            return self._json(200, svc.put_pool(self._admin(), name, body))

        @app.delete("/v1/admin/pools/<name>", summary="Remove an operator's pool definition",
                    responses=_responses(200, AdminDoc, (404, 409)), tags=tags)
        def delete_pool(name: Annotated[str, Path(max_length=64)]):
            return self._json(200, svc.delete_pool(self._admin(), name))

        @app.get("/v1/admin/models", summary="The model catalog: the models jobs may name and the content hash each runs",
                 responses=_responses(200, AdminPage, ()), tags=tags)
        def list_models():
            self._admin()
            return self._json(200, {"items": svc.models()})

        @app.get("/v1/admin/models/<name>", summary="A model's catalog entry", responses=_responses(200, AdminDoc),
                 tags=tags)
        def get_model(name: MODEL):
            self._admin()
            return self._json(200, svc.model(name))

        @app.put("/v1/admin/models/<name>",
                 summary="Register a model (or replace its hash): the published manifest's hash, else the body's "
                         "(a model on nodes' local model roots)",
                 responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def put_model(name: MODEL, body: ModelIn):
            return self._json(200, svc.put_model(self._admin(), name, body))

        @app.delete("/v1/admin/models/<name>", summary="Deregister a model: jobs naming it are refused from then on",
                    responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def delete_model(name: MODEL, expected_version: Annotated[int | None, Query(ge=1)] = None):
            return self._json(200, svc.delete_model(self._admin(), name, expected_version))

        @app.get("/v1/admin/nodes", summary="Registered nodes", responses=_responses(200, AdminPage, ()), tags=tags)
        def list_nodes():
            self._admin()
            return self._json(200, {"items": svc.nodes()})

        @app.get("/v1/admin/nodes/<node_id>", summary="A node's registration", responses=_responses(200, AdminDoc),
                 tags=tags)
        def get_node(node_id: NODE):
            self._admin()
            return self._json(200, svc.node(node_id))

        @app.put("/v1/admin/nodes/<node_id>/pool", summary="Bind a node to a pool",
                 responses=_responses(200, AdminDoc, (400, 404, 409)), tags=tags)
        def bind_node(node_id: NODE, body: NodeBindIn):
            return self._json(200, svc.bind_node(self._admin(), node_id, body))

        @app.post("/v1/admin/nodes/<node_id>/drain", summary="Drain a node (no new placements)",
                  responses=_responses(200, AdminDoc, (404, 409)), tags=tags)
        def drain(node_id: NODE):
            return self._json(200, svc.drain(self._admin(), node_id, True))

        @app.post("/v1/admin/nodes/<node_id>/undrain", summary="Undrain a node",
                  responses=_responses(200, AdminDoc, (404, 409)), tags=tags)
        def undrain(node_id: NODE):
            return self._json(200, svc.drain(self._admin(), node_id, False))

        @app.delete("/v1/admin/nodes/<node_id>",
                    summary="Deregister a node: no placements, its node API calls refused (409 while it holds "
                            "attempts, unless force)",
                    responses=_responses(200, AdminDoc, (404, 409)), tags=tags)
        def deregister(node_id: NODE,
                       force: Annotated[bool, Query(description="also when it holds attempts: they end at their "
                                                    "heartbeat timeout and are placed again")] = False,
                       expected_version: Annotated[int | None, Query(ge=1)] = None):
            return self._json(200, svc.deregister(self._admin(), node_id, force=force,
                                                  expected_version=expected_version))

        @app.get("/v1/admin/audit", summary="Administration changes of one month, newest first",
                 responses=_responses(200, AdminPage, (400,)), tags=tags)
        def audit(month: Annotated[str | None, Query(max_length=7)] = None,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100):
            self._admin()
            return self._json(200, {"items": svc.audit(month, limit)})

    def handle(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        try:
            request_body.check(event)
        except GpufleetError as err:
            status, headers, text = to_problem(err, instance=event.get("path"))
            return {"statusCode": status, "headers": headers, "body": text, "isBase64Encoded": False}
        with _RESOLVE_LOCK:  # Powertools keeps the current event on the class (see gpufleet.api.app)
            return self.app.resolve(event, context)

    def openapi(self) -> dict[str, Any]:
        return json.loads(self.app.get_openapi_json_schema(title="gpufleet administration API", version="1.0.0",
                                                           openapi_version="3.1.0"))
