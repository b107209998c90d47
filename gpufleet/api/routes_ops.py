"""Routes of recovery (operator), retry, job arrays, bulk cancel and cost reports, on an :class:`~gpufleet.api.app.Api`.

Thin like every route: resolve the caller, call one service function (:mod:`gpufleet.api.recovery`,
:mod:`gpufleet.api.arrays`, :mod:`gpufleet.api.costs`), return. Operator-only checks happen in the
service functions, server-side.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.api import arrays, costs, diagnosis, recovery
from gpufleet.api.models import (
    BulkCancelRequest,
    BulkCancelView,
    CostReport,
    DiagnosisReport,
    JobArrayRequest,
    JobArrayView,
    JobInspection,
    JobPage,
    JobView,
    RecoveryRequest,
)

JOB_ID = Annotated[str, Path(description="job id (job_<ulid>)", max_length=64)]
IDEMPOTENCY = Annotated[
    str | None, Header(alias="Idempotency-Key", description="1-255 visible ASCII characters; required", max_length=255)
]


def register(api: Any, responses) -> None:  # noqa: C901 - one closure per route, each thin
    """Add the routes to ``api``'s resolver (``api``: the :class:`gpufleet.api.app.Api` being built;
    ``responses``: the app's documented-responses helper)."""
    app, deps = api.app, api.deps

    def accepted(res) -> Response:
        headers = dict(res.headers)
        if res.replayed:
            headers["Idempotent-Replayed"] = "true"
            api.metrics.add_metric(name="IdempotentReplays", unit=MetricUnit.Count, value=1)
        return api._json(res.status, res.body, headers)

    def key(value: str | None) -> str | None:
        return value or app.current_event.headers.get("idempotency-key")

    @app.post(
        "/v1/jobs/<job_id>/retry",
        summary="Submit an ended job again as a new, linked job",
        description="Same spec, new job with `retry_of`; the Idempotency-Key header is required (the same key "
        "replays the first retry).",
        responses=responses(202, JobView, "Accepted; Location names the new job", (400, 404, 409, 422, 429)),
        tags=["jobs"],
    )
    def retry_job(job_id: JOB_ID, idempotency_key: IDEMPOTENCY = None):
        api._correlate(job_id)
        return accepted(recovery.retry(deps, api._who(), job_id, key(idempotency_key),
                                         traceparent=api._traceparent()))

    @app.post(
        "/v1/job-arrays",
        summary="Submit a job array: `count` jobs from one spec, `{index}` substituted",
        description="One Idempotency-Key for the whole array: a retried request submits nothing more.",
        responses=responses(202, JobArrayView, "Accepted; every element is its own job", (400, 403, 409, 413, 415,
                                                                                        422, 429)),
        tags=["jobs"],
    )
    def submit_array(req: JobArrayRequest, idempotency_key: IDEMPOTENCY = None):
        res = arrays.submit_array(deps, api._who(), req, key(idempotency_key),
                                  traceparent=api._traceparent())
        if not res.replayed:
            api.metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=req.count)
        return accepted(res)

    @app.post(
        "/v1/jobs/cancel",
        summary="Cancel every unfinished job matching a label selector and/or an array id",
        responses=responses(200, BulkCancelView, "What was matched and cancelled", (400, 413, 415)),
        tags=["jobs"],
    )
    def bulk_cancel(req: BulkCancelRequest):
        return api._json(200, arrays.bulk_cancel(deps, api._who(), req.array_id, req.labels))

    @app.get(
        "/v1/costs",
        summary="Costs from the billing ledger, grouped; charged and waived apart",
        responses=responses(200, CostReport, "The report (JSON, or CSV with format=csv)", (400,)),
        tags=["fleet"],
    )
    def get_costs(
        by: Annotated[str, Query(description="tenant | team | user | label | pool")] = "tenant",
        since: Annotated[datetime | None, Query(description="inclusive, RFC 3339 with timezone")] = None,
        until: Annotated[datetime | None, Query(description="exclusive, RFC 3339 with timezone")] = None,
        label_key: Annotated[str | None, Query(max_length=63, description="with by=label")] = None,
        tenant: Annotated[str | None, Query(max_length=63, description="operators only: another tenant")] = None,
        format: Annotated[str, Query(description="json | csv")] = "json",  # noqa: A002 - the query name
    ):
        rep = costs.report(deps, api._who(), by=by, since=since, until=until, label_key=label_key, tenant=tenant)
        if format == "csv":
            return Response(status_code=200, content_type="text/csv", body=costs.to_csv(rep))
        return api._json(200, rep)

    # ------------------------------------------------------------ operator recovery and diagnosis

    @app.get(
        "/v1/admin/diagnose",
        summary="Operators: where a window's GPU time went, every GPU-second to one cause, lost causes ranked",
        description="Computing, model load, staging, checkpoint, post-processing, starting, held idle, and free "
        "GPUs split by why the queue's work did not run (fragmentation, quota, affinity, scheduler latency, head "
        "of line) or that nothing was runnable; each with its likely fix (docs/operations.md).",
        responses=responses(200, DiagnosisReport, "The attribution", (400,)),
        tags=["admin"],
    )
    def diagnose(
        since: Annotated[datetime | None, Query(description="inclusive, RFC 3339 with timezone; default: until - 1 h")] = None,
        until: Annotated[datetime | None, Query(description="exclusive, RFC 3339 with timezone; default: now")] = None,
        pool: Annotated[str | None, Query(max_length=63, description="only this pool's nodes")] = None,
        lanes: Annotated[bool, Query(description="include one lane per GPU (the timeline)")] = False,
        fleet: Annotated[bool, Query(description="include each node's state, GPUs and models now")] = False,
    ):
        return api._json(200, diagnosis.diagnose(deps, api._who(), since=since, until=until, pool=pool, lanes=lanes,
                                                 fleet=fleet))

    @app.get(
        "/v1/admin/quarantine",
        summary="Operators: a tenant's quarantined jobs, newest first",
        responses=responses(200, JobPage, "One page", (400,)),
        tags=["admin"],
    )
    def list_quarantined(
        tenant: Annotated[str | None, Query(max_length=63, description="default: the operator's own")] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        cursor: Annotated[str | None, Query(max_length=2048)] = None,
    ):
        return api._json(200, recovery.list_quarantined(deps, api._who(), tenant=tenant, limit=limit, cursor=cursor))

    @app.get(
        "/v1/admin/jobs/<job_id>",
        summary="Operators: inspect a job (attempts, classified failures, nodes, events, logs)",
        responses=responses(200, JobInspection, "The inspection", (400, 404)),
        tags=["admin"],
    )
    def inspect_job(job_id: JOB_ID):
        api._correlate(job_id)
        return api._json(200, recovery.inspect(deps, api._who(), job_id))

    def action(path: str, summary: str, fn) -> None:
        @app.post(path, summary=summary, responses=responses(200, JobView, "The job after the action",
                                                             (400, 404, 409, 413, 415)), tags=["admin"])
        def act(job_id: JOB_ID, req: RecoveryRequest | None = None):
            api._correlate(job_id)
            return api._json(200, fn(deps, api._who(), job_id, req.reason if req else None))

        act.__name__ = f"admin_{fn.__name__}"

    action("/v1/admin/jobs/<job_id>/release",
           "Operators: re-queue a quarantined job with a fresh failure budget", recovery.release)
    action("/v1/admin/jobs/<job_id>/cancel", "Operators: close a quarantined job out as CANCELLED", recovery.close)
    action("/v1/admin/jobs/<job_id>/refinalize",
           "Operators: rerun Finalize, Publish and Bill of a job whose finalize ran out of retries", recovery.refinalize)
