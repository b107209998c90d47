"""Job arrays and bulk cancellation.

Contract (docs/api.md "Job arrays and bulk operations"):
- :func:`substitute` (pure) replaces ``placeholder`` by the index in every string of a spec document
  (keys untouched); each element's spec must validate as a :class:`JobSpec` (else 400 naming the index).
- :func:`submit_array` (``POST /v1/job-arrays``): ONE Idempotency-Key for the whole array (the payload
  hash covers spec, count and placeholder). All ``count`` jobs (each its own job, ``array_id`` and
  ``array_index`` on the item), their events and the key's completion are ONE DynamoDB transaction:
  a retried or concurrent request with the same key replays the first response and submits nothing
  more; a crash mid-way leaves nothing behind. The soft queued-jobs quota must fit the whole array.
- :func:`bulk_cancel` (``POST /v1/jobs/cancel``): every unfinished job of the caller's tenant that
  matches all the given selectors (``array_id``, ``labels``) is cancel-requested (idempotent per job)
  and the cancellation propagated like ``DELETE /v1/jobs/{id}``; a job that ended meanwhile is
  reported as skipped. At least one selector is required.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gpufleet import tracing
from gpufleet.api import service
from gpufleet.api.models import BulkCancelView, JobArrayRequest, JobArrayView
from gpufleet.api.service import Deps, HttpResult
from gpufleet.errors import BadRequest, InvalidTransition, ValidationFailed
from gpufleet.ids import new_job_id, ulid
from gpufleet.spec import JobSpec, payload_hash
from gpufleet.status import TERMINAL, JobStatus
from gpufleet.store.model_catalog import pinned_model
from gpufleet.store.principals import Principal

#: unfinished statuses a bulk cancel looks at
UNFINISHED = [s for s in JobStatus if s not in TERMINAL]
#: most jobs one bulk cancel examines (pages of the tenant's unfinished jobs)
BULK_MAX = 1000


def substitute(doc: Any, placeholder: str, index: int) -> Any:
    """``doc`` with ``placeholder`` replaced by ``index`` in every string value (pure)."""
    if isinstance(doc, str):
        return doc.replace(placeholder, str(index))
    if isinstance(doc, list):
        return [substitute(v, placeholder, index) for v in doc]
    if isinstance(doc, dict):
        return {k: substitute(v, placeholder, index) for k, v in doc.items()}
    return doc


def element_specs(req: JobArrayRequest) -> list[JobSpec]:
    """Every element's validated spec; 400 naming the first element that does not validate."""
    out = []
    for i in range(req.count):
        try:
            out.append(JobSpec.model_validate(substitute(req.spec, req.placeholder, i)))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ValidationFailed(f"array element {i}: spec.{where}: {first.get('msg')}") from err
    return out


def submit_array(deps: Deps, who: Principal, req: JobArrayRequest, idempotency_key: str | None,
                 traceparent: str | None = None) -> HttpResult:
    """``POST /v1/job-arrays`` (module contract); 202 with :class:`JobArrayView`. Every element gets its
    own ``traceparent`` (:func:`gpufleet.tracing.for_request` of the caller's header: its trace id if valid)."""
    specs = element_specs(req)
    pins: list[dict[str, str]] = []
    by_model: dict[tuple[str, str | None], dict[str, str]] = {}  # one catalog read per model, not per element
    for spec in specs:
        service.admit_spec(deps, who, spec)
        model = (spec.workload.kind, getattr(spec.workload, "model", None))
        if model not in by_model:
            by_model[model] = pinned_model(deps.models, spec.workload)
        pins.append(by_model[model])
    fingerprint = payload_hash({"array": req.model_dump(mode="json")})
    got = service.begin_idempotent(deps, who, idempotency_key, fingerprint)
    if isinstance(got, service.idem.Replay):
        return HttpResult(got.status, dict(got.headers), got.body, got.job_id, replayed=True)
    try:
        service.check_soft_quota(deps, who, adding=req.count)
        now_ms = int(deps.clock.now() * 1000)
        array_id = "arr_" + ulid(now_ms).lower()
        jobs = [(new_job_id(now_ms), spec.model_dump(mode="json", exclude_none=True),
                 {"array_id": array_id, "array_index": i, **pins[i],
                  "traceparent": tracing.for_request(traceparent, deps.clock.now())}) for i, spec in enumerate(specs)]
        view = JobArrayView(array_id=array_id, count=req.count, job_ids=[j[0] for j in jobs])
        body = view.model_dump_json()
        headers = {"Location": f"/v1/jobs?array_id={array_id}"}
        deps.jobs.create_many(
            tenant=who.tenant, team=who.team, user=who.user, jobs=jobs,
            extra_items=lambda _items: [deps.idempotency.completion(got, 202, headers, body, array_id)],
        )
    except BaseException:
        deps.idempotency.abandon(got)
        raise
    return HttpResult(202, headers, body, array_id)


def bulk_cancel(deps: Deps, who: Principal, array_id: str | None, labels: dict[str, str] | None) -> BulkCancelView:
    """``POST /v1/jobs/cancel`` (module contract)."""
    if not array_id and not labels:
        raise BadRequest("give array_id or labels (or both): a bulk cancel needs a selector", param="array_id")
    matched: list[str] = []
    cursor = None
    while len(matched) < BULK_MAX:
        items, cursor = deps.jobs.list(tenant=who.tenant, secret=deps.settings.cursor_key, statuses=UNFINISHED,
                                       limit=100, cursor=cursor, array_id=array_id, labels=labels)
        matched += [i["job_id"] for i in items]
        if not cursor:
            break
    cancelled, skipped = [], []
    for job_id in matched[:BULK_MAX]:
        try:
            service.cancel(deps, who, job_id)
            cancelled.append(job_id)
        except InvalidTransition as err:
            skipped.append({"job_id": job_id, "status": err.extra.get("current_status"), "reason": err.detail})
    return BulkCancelView(matched=len(matched), cancelled=cancelled, skipped=skipped)


def parse_label_selector(values: list[str] | None) -> dict[str, str] | None:
    """``key=value`` query values → a selector (400 on a value without ``=``)."""
    if not values:
        return None
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise BadRequest(f"label selector {json.dumps(v)} is not key=value", param="label")
        out[key] = val
    return out
