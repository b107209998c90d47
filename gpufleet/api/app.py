"""The API Lambda app: Powertools REST resolver, routes, one exception mapper, logs and metrics.

Contract:
- :class:`Api` owns one resolver; routes validate input (pydantic, via
  Powertools), resolve the caller from ``requestContext.identity.userArn``
  (unknown → 403), call one :mod:`gpufleet.api.service` function and return.
- Before it is resolved, a request's body passes :func:`gpufleet.api.body.check`
  (size, media type, UTF-8, strict JSON); the resolver parses bodies with
  :func:`gpufleet.api.body.loads`. After the caller is resolved, its tenant's
  request rate limit is spent (:func:`gpufleet.api.service.admit`).
- ``serves`` (optional) bounds the routes one deployment of the app answers: the provenance lookup's own function
  (``lambdas/api/lookup.py``, :data:`LOOKUP_ROUTE`) serves that route alone, any other request is a 404 problem
  before anything is read; the API function serves every route (the lookup answers 409 there: it holds no
  watermark key, API Gateway routes lookups to their own function).
- Every exception becomes an RFC 9457 problem through :meth:`Api._error` (the
  only place), using :func:`gpufleet.api.problems.as_error` and
  :func:`gpufleet.api.problems.to_problem`; a 4xx counts as ``ClientErrors``,
  a 5xx as ``ServerErrors`` (the alarmed metric).
- Logs are structured JSON (Powertools Logger) with the job id as correlation
  id; each request emits EMF metrics (requests, latency, 4xx/5xx, submissions,
  replays, quota rejections).
- Powertools keeps the event being resolved in a class attribute
  (``BaseRouter.current_event``), shared by every resolver in the process, so
  :meth:`Api.handle` resolves one event at a time per process (a Lambda
  container only ever has one); multi-threaded hosts such as the local gateway
  are safe.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.models import Server
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from gpufleet import tracing
from gpufleet.api import arrays, routes_ops, routes_webhooks, service
from gpufleet.api import body as request_body
from gpufleet.api.cors import cors
from gpufleet.api.models import (
    DeliveryList,
    EventList,
    JobPage,
    JobView,
    LogPage,
    ModelList,
    OutputView,
    PoolList,
    Problem,
    ProvenanceLookup,
    ProvenanceLookupRequest,
    QuotaView,
    RotateSecret,
    WebhookSecrets,
)
from gpufleet.api.problems import PROBLEM_JSON, as_error, to_problem
from gpufleet.api.service import Deps
from gpufleet.errors import GpufleetError, NotFound, QuotaExceeded, TooManyRequests
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus
from gpufleet.store import principals
from gpufleet.store.principals import Principal

logger = Logger(service="gpufleet-api")
JSON = "application/json"
TITLE = "gpufleet API"
VERSION = "1.0.0"

_ERROR_TEXT = {
    400: "Invalid request (problem type validation or bad-request)",
    403: "Unknown IAM principal or bad signature (problem type forbidden); image or input refused by site policy "
    "(problem type not-allowed, with field)",
    404: "No such job (or webhook endpoint) for this tenant (problem type not-found)",
    409: "Conflict: job already terminal, or an identical request is still in flight; a per-tenant limit reached "
    "(problem type limit-reached)",
    413: "Request body larger than REQUEST_BODY_MAX_BYTES (problem type payload-too-large)",
    415: "Request body that is not application/json (problem type unsupported-media-type)",
    422: "Idempotency-Key reused with a different payload (problem type idempotency-mismatch)",
    429: "The tenant's request rate limit is spent (problem type rate-limited), or, for submissions, the soft "
    "quota of queued jobs is reached (problem type quota-exceeded); see Retry-After",
    500: "Internal error",
    503: "A dependency is not configured or unavailable (problem type unavailable)",
}
#: Larger request bodies are refused with 413 before they are parsed (gpufleet.api.body).
REQUEST_BODY_MAX_BYTES = request_body.MAX_BYTES
#: One resolution at a time per process (see module doc).
_RESOLVE_LOCK = threading.Lock()
JOB_ID = Annotated[str, Path(description="job id (job_<ulid>)", max_length=64)]


def _responses(
    code: int, model: type | None, description: str, errors: tuple[int, ...], *, limited: bool = True
) -> dict[int, Any]:
    """The documented responses of a route; every route the rate limit applies to (``limited``) may 429."""
    out: dict[int, Any] = {}
    if model is None:
        out[code] = {"description": description, "content": {JSON: {"schema": {"type": "object"}}}}
    else:
        out[code] = {"description": description, "content": {JSON: {"model": model}}}
    for e in sorted({*errors, 403, 500, *((429,) if limited else ())}):
        out[e] = {"description": _ERROR_TEXT[e], "content": {PROBLEM_JSON: {"model": Problem}}}
    return out


#: the provenance lookup's route, served by a function of its own (``serves``)
LOOKUP_ROUTE = ("POST", "/v1/provenance/lookup")


class Api:
    """One resolver bound to :class:`Deps`; call :meth:`handle` with an API Gateway REST proxy event."""

    def __init__(self, deps: Deps, *, serves: frozenset[tuple[str, str]] | None = None) -> None:
        self.deps = deps
        self.serves = serves
        self.metrics = EphemeralMetrics(namespace="gpufleet", service="api")
        app = self.app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=request_body.loads,
                                                cors=cors(deps.settings.cors_origin))
        app.configure_openapi(
            title=TITLE,
            version=VERSION,
            summary="Submit and manage GPU jobs (text-to-video and containers) across on-prem machines and AWS.",
            servers=[Server(url="/")],
        )
        app.exception_handler(Exception)(self._problem)
        app.not_found(self._not_found)
        self._routes()

    # ---------------------------------------------------------------- plumbing

    def _who(self) -> Principal:
        ctx = self.app.current_event.get("requestContext") or {}
        arn = (ctx.get("identity") or {}).get("userArn")
        who = principals.resolve(self.deps.ddb, self.deps.settings.control_table, arn)
        logger.append_keys(owner=who.owner_path)
        service.admit(self.deps, who)
        return who

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
        text = body if isinstance(body, str) else body.model_dump_json()
        return Response(status_code=status, content_type=JSON, body=text, headers=headers or {})

    def _error(self, exc: BaseException, path: str | None) -> tuple[int, dict[str, str], str]:
        """The one place an exception becomes a problem response: counted (4xx ``ClientErrors``, 5xx
        ``ServerErrors``), logged, and mapped by :func:`gpufleet.api.problems.to_problem`."""
        err = as_error(exc)
        if err.status < 500:
            self.metrics.add_metric(name="ClientErrors", unit=MetricUnit.Count, value=1)
            if isinstance(err, QuotaExceeded):
                self.metrics.add_metric(name="QuotaRejections", unit=MetricUnit.Count, value=1)
            if isinstance(err, TooManyRequests):
                self.metrics.add_metric(name="RateLimited", unit=MetricUnit.Count, value=1)
            logger.info("request failed", extra={"status": err.status, "problem": err.type_slug, "detail": err.detail})
        elif isinstance(exc, GpufleetError):
            self.metrics.add_metric(name="ServerErrors", unit=MetricUnit.Count, value=1)
            logger.info("request failed", extra={"status": err.status, "problem": err.type_slug, "detail": err.detail})
        else:
            self.metrics.add_metric(name="ServerErrors", unit=MetricUnit.Count, value=1)
            logger.exception("unhandled error")
        return to_problem(err, instance=path)

    def _problem(self, exc: Exception) -> Response:
        status, headers, body = self._error(exc, self.app.current_event.path)
        return Response(status_code=status, content_type=PROBLEM_JSON, body=body, headers=headers)

    def _refused(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The problem response for a route this deployment does not serve (``serves``) or a body
        :func:`gpufleet.api.body.check` refuses, else None."""
        try:
            if self.serves is not None and (event.get("httpMethod"), event.get("path")) not in self.serves:
                raise NotFound(f"no route for {event.get('httpMethod')} {event.get('path')}")
            request_body.check(event)
            return None
        except GpufleetError as err:
            status, headers, text = self._error(err, event.get("path"))
            return {"statusCode": status, "headers": headers, "body": text, "isBase64Encoded": False}

    def _not_found(self, _exc: Exception) -> Response:
        return self._problem(
            NotFound(f"no route for {self.app.current_event.http_method} {self.app.current_event.path}")
        )

    def _correlate(self, job_id: str, traceparent: str | None = None) -> None:
        logger.set_correlation_id(job_id)
        logger.append_keys(job_id=job_id)
        if tracing.trace_id(traceparent):
            logger.append_keys(trace_id=tracing.trace_id(traceparent))

    def _traceparent(self) -> str | None:
        """The caller's W3C ``traceparent`` header (:mod:`gpufleet.tracing`), if any."""
        return (self.app.current_event.headers or {}).get(tracing.HEADER)

    # ---------------------------------------------------------------- routes

    def _routes(self) -> None:  # noqa: C901 - one closure per route, each thin
        app, deps = self.app, self.deps

        @app.post(
            "/v1/jobs",
            summary="Submit a job",
            description=(
                "Idempotent: the Idempotency-Key header is required and scoped to the tenant; keys are kept 24 h. "
                "The same key and payload replays the first response with `Idempotent-Replayed: true`."
            ),
            responses=_responses(202, JobView, "Accepted; Location names the job", (400, 409, 413, 415, 422, 429)),
            tags=["jobs"],
        )
        def submit_job(
            spec: JobSpec,
            idempotency_key: Annotated[
                str | None,
                Header(alias="Idempotency-Key", description="1-255 visible ASCII characters; required", max_length=255),
            ] = None,
        ):
            who = self._who()
            key = idempotency_key or app.current_event.headers.get("idempotency-key")
            res = service.submit(deps, who, spec, key, traceparent=self._traceparent())
            if res.job_id:
                self._correlate(res.job_id, res.headers.get(tracing.HEADER))
            headers = dict(res.headers)
            if res.replayed:
                headers["Idempotent-Replayed"] = "true"
                self.metrics.add_metric(name="IdempotentReplays", unit=MetricUnit.Count, value=1)
            else:
                self.metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=1)
                logger.info("job submitted", extra={"status": "QUEUED"})
            return self._json(res.status, res.body, headers)

        @app.get(
            "/v1/jobs",
            summary="List the tenant's jobs, newest first",
            responses=_responses(200, JobPage, "One page of jobs", (400,)),
            tags=["jobs"],
        )
        def list_jobs(
            status: Annotated[list[JobStatus] | None, Query(description="repeat to match any of several")] = None,
            created_after: Annotated[datetime | None, Query(description="inclusive, RFC 3339 with timezone")] = None,
            created_before: Annotated[datetime | None, Query(description="exclusive, RFC 3339 with timezone")] = None,
            limit: Annotated[int, Query(ge=1, le=100)] = 20,
            cursor: Annotated[
                str | None, Query(max_length=2048, description="next_cursor of the previous page")
            ] = None,
            mine: Annotated[bool, Query(description="only the caller's own jobs")] = False,
            user: Annotated[str | None, Query(max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                                              description="only this user's jobs (of the caller's tenant)")] = None,
            array_id: Annotated[str | None, Query(max_length=64, description="only this job array's elements")] = None,
            label: Annotated[
                list[str] | None, Query(description="key=value; repeat to require several labels")
            ] = None,
        ):
            page = service.list_jobs(
                deps,
                self._who(),
                status=status,
                created_after=created_after,
                created_before=created_before,
                limit=limit,
                cursor=cursor,
                mine=mine,
                user=user,
                array_id=array_id,
                labels=arrays.parse_label_selector(label),
            )
            return self._json(200, page)

        @app.get(
            "/v1/jobs/<job_id>",
            summary="Get a job",
            responses=_responses(200, JobView, "The job", (400, 404)),
            tags=["jobs"],
        )
        def get_job(job_id: JOB_ID):
            self._correlate(job_id)
            return self._json(200, service.get(deps, self._who(), job_id))

        @app.delete(
            "/v1/jobs/<job_id>",
            summary="Request cancellation (idempotent)",
            responses=_responses(202, JobView, "Cancellation requested", (400, 404, 409)),
            tags=["jobs"],
        )
        def cancel_job(job_id: JOB_ID):
            self._correlate(job_id)
            job = service.cancel(deps, self._who(), job_id)
            self.metrics.add_metric(name="CancelRequests", unit=MetricUnit.Count, value=1)
            return self._json(202, job)

        @app.get(
            "/v1/jobs/<job_id>/events",
            summary="The job's event timeline",
            responses=_responses(200, EventList, "Events, oldest first", (400, 404)),
            tags=["jobs"],
        )
        def job_events(job_id: JOB_ID):
            self._correlate(job_id)
            return self._json(200, service.events(deps, self._who(), job_id))

        @app.get(
            "/v1/jobs/<job_id>/logs",
            summary="Log lines written by the job's workers",
            responses=_responses(200, LogPage, "Lines after `after`; follow with `next`", (400, 404)),
            tags=["jobs"],
        )
        def job_logs(
            job_id: JOB_ID,
            after: Annotated[str | None, Query(max_length=64, description="`next` of the previous page")] = None,
        ):
            self._correlate(job_id)
            return self._json(200, service.logs(deps, self._who(), job_id, after))

        @app.get(
            "/v1/jobs/<job_id>/output",
            summary="Presigned links to the video and its C2PA manifest (SUCCEEDED only)",
            responses=_responses(200, OutputView, "Links valid at most 15 minutes", (400, 404, 409)),
            tags=["jobs"],
        )
        def job_output(job_id: JOB_ID):
            self._correlate(job_id)
            return self._json(200, service.output(deps, self._who(), job_id))

        @app.get(
            "/v1/jobs/<job_id>/webhooks",
            summary="The job's webhook delivery log",
            responses=_responses(200, DeliveryList, "Deliveries, oldest first", (400, 404)),
            tags=["jobs"],
        )
        def job_webhooks(job_id: JOB_ID):
            self._correlate(job_id)
            return self._json(200, service.deliveries(deps, self._who(), job_id))

        @app.post(
            LOOKUP_ROUTE[1],
            summary="Find the kept C2PA manifest of a video by the platform's watermark",
            description=(
                "The body carries the questioned video's mean luma (what `gpufleet verify FILE` computes): the "
                "platform detects its keyed watermark and returns the manifests of the SUCCEEDED jobs whose "
                "payload it carries, even when the copy was stripped of its manifest, re-encoded, scaled, "
                "cropped or flipped. Bodies up to 3.5 MiB."
            ),
            responses=_responses(200, ProvenanceLookup, "Detection and matches (found: false when no valid mark)",
                                 (400, 409, 413, 415)),
            tags=["provenance"],
        )
        def provenance_lookup(req: ProvenanceLookupRequest):
            return self._json(200, service.provenance_lookup(deps, self._who(), req))

        @app.get(
            "/v1/quota",
            summary="The caller's quota and usage",
            responses=_responses(200, QuotaView, "Quota tree", ()),
            tags=["fleet"],
        )
        def get_quota():
            return self._json(200, service.quota(deps, self._who()))

        @app.get(
            "/v1/pools",
            summary="Pools and their capacity",
            responses=_responses(200, PoolList, "Pools", ()),
            tags=["fleet"],
        )
        def get_pools():
            return self._json(200, service.pools(deps, self._who()))

        @app.get(
            "/v1/models",
            summary="The models jobs may name",
            description="The built-in models, then the deployment's model catalog (registered by operators). A "
            "video.generate job naming any other model is refused (400 naming `workload.model`); one naming a "
            "catalogued model is pinned to its `content_hash`.",
            responses=_responses(200, ModelList, "Models", ()),
            tags=["fleet"],
        )
        def get_models():
            return self._json(200, service.models(deps, self._who()))

        routes_ops.register(self, _responses)
        routes_webhooks.register(self, _responses)

        @app.get(
            "/v1/webhooks/secrets",
            summary="The tenant's webhook signing secrets (a first one is made if there is none)",
            description="Verify deliveries with any listed secret: during a rotation's overlap each delivery carries "
            "one `v1,<signature>` per secret in `webhook-signature` (Standard Webhooks).",
            responses=_responses(200, WebhookSecrets, "Live secrets, the current one first", (503,)),
            tags=["webhooks"],
        )
        def get_webhook_secrets():
            return self._json(200, service.webhook_secrets(deps, self._who()))

        @app.post(
            "/v1/webhooks/secrets/rotate",
            summary="Rotate the tenant's webhook signing secret",
            description="A new current secret; the previous one keeps signing for `overlap_seconds` (default one "
            "day), so receivers can switch without losing a delivery. A concurrent rotation is a 409.",
            responses=_responses(200, WebhookSecrets, "Live secrets after the rotation", (400, 409, 413, 415, 503)),
            tags=["webhooks"],
        )
        def rotate_webhook_secret(body: RotateSecret):
            return self._json(200, service.rotate_webhook_secret(deps, self._who(), body.overlap_seconds))

        @app.get(
            "/v1/openapi.json",
            summary="This OpenAPI 3.1 document",
            responses=_responses(200, None, "OpenAPI document", (), limited=False),
            tags=["meta"],
        )
        def openapi_doc():
            return self._json(200, json.dumps(self.openapi(), separators=(",", ":")))

    # ---------------------------------------------------------------- entry points

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document generated from the route and pydantic models."""
        return build_openapi(self.app)

    def handle(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        started = time.perf_counter()
        with _RESOLVE_LOCK:
            logger.remove_keys(["job_id", "owner", "correlation_id", "trace_id"])
            resp: dict[str, Any] = {}
            try:
                resp = self._refused(event) or self.app.resolve(event, context)
            finally:
                elapsed_ms = (time.perf_counter() - started) * 1000
                self.metrics.add_metric(name="Requests", unit=MetricUnit.Count, value=1)
                self.metrics.add_metric(name="Latency", unit=MetricUnit.Milliseconds, value=elapsed_ms)
                self.metrics.flush_metrics()
                logger.info(
                    "request",
                    extra={
                        "method": event.get("httpMethod"),
                        "path": event.get("path"),
                        "status": resp.get("statusCode"),
                        "latency_ms": round(elapsed_ms, 2),
                        "request_id": (event.get("requestContext") or {}).get("requestId"),
                    },
                )
        return resp


def build_openapi(app: APIGatewayRestResolver) -> dict[str, Any]:
    doc = json.loads(app.get_openapi_json_schema(title=TITLE, version=VERSION, openapi_version="3.1.0"))
    comps = doc.setdefault("components", {})
    comps.setdefault("securitySchemes", {})["sigv4"] = {
        "type": "apiKey",
        "name": "Authorization",
        "in": "header",
        "description": "AWS Signature Version 4 (API Gateway AWS_IAM authorization)",
        "x-amazon-apigateway-authtype": "awsSigv4",
    }
    doc["security"] = [{"sigv4": []}]
    # Powertools documents a 422 for request validation; this API answers 400 (see docs/api.md),
    # and only the idempotent POSTs have a 422 of their own (idempotency mismatch).
    idempotent = {"/v1/jobs", "/v1/job-arrays", "/v1/jobs/{job_id}/retry"}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            if not (path in idempotent and method == "post"):
                op.get("responses", {}).pop("422", None)
            if "204" in op.get("responses", {}):  # No Content: no body to describe
                op["responses"]["204"].pop("content", None)
            for param in op.get("parameters", []):
                if param.get("in") == "header" and param.get("name") == "idempotency-key":
                    # Powertools lower-cases header names and cannot express "required, else 400".
                    param.update(
                        name="Idempotency-Key",
                        required=True,
                        schema={"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"},
                    )
    comps.get("schemas", {}).pop("HTTPValidationError", None)
    comps.get("schemas", {}).pop("ValidationError", None)
    return doc
