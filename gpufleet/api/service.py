"""What each API operation does, independent of HTTP framing.

Contract: every function takes :class:`Deps` (clients, settings, clock) and the
resolved :class:`~gpufleet.store.principals.Principal`, and returns a model or
an :class:`HttpResult`; failures are :mod:`gpufleet.errors` exceptions, which
the API turns into problem+json in one place (:mod:`gpufleet.api.problems`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet import tracing
from gpufleet.api import admission, quota_view
from gpufleet.api.models import (
    Delivery,
    DeliveryList,
    EventList,
    EventView,
    JobPage,
    JobView,
    LogLine,
    LogPage,
    ModelList,
    ModelView,
    OutputFile,
    OutputView,
    PoolList,
    PoolView,
    ProvenanceLookup,
    ProvenanceLookupRequest,
    ProvenanceMatch,
    QueuedLimits,
    QuotaLevel,
    QuotaView,
    WebhookSecrets,
    WebhookSecretView,
)
from gpufleet.api.settings import ApiSettings
from gpufleet.clock import Clock, iso
from gpufleet.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    InvalidTransition,
    NotFound,
    QuotaExceeded,
    TooManyRequests,
    TransientError,
)
from gpufleet.gang import batch_members_view
from gpufleet.ids import new_job_id
from gpufleet.lifecycle import cancel as cancel_propagation
from gpufleet.nodeapi.gangstate import GangState, members_view
from gpufleet.placement import Placement
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus
from gpufleet.store import idempotency as idem
from gpufleet.store import jobs as job_store
from gpufleet.store import objects
from gpufleet.store.diagnosis import DiagnosisReader, DynamoDiagnosisReader
from gpufleet.store.idempotency import DynamoIdempotencyStore, IdempotencyStore
from gpufleet.store.jobs import DynamoJobStore, JobStore
from gpufleet.store.model_catalog import BUILTIN_MODELS, DynamoModelCatalog, ModelCatalog, pinned_model
from gpufleet.store.principals import Principal
from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceIndex
from gpufleet.store.queues import SqsNodeSignals
from gpufleet.store.queueview import DynamoQueueViewStore, QueueViewStore
from gpufleet.store.ratelimit import DynamoRateLimitStore, RateLimitStore
from gpufleet.store.webhook_endpoints import DynamoWebhookEndpoints, WebhookEndpointStore
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox, WebhookKeyStore
from gpufleet.store.workflow import AwsBatchJobs, SfnTaskTokens
from gpufleet.webhooks import delivery, urlpolicy
from gpufleet.webhooks import keys as webhook_key_rules
from gpufleet.webhooks.keys import WebhookKey

log = logging.getLogger(__name__)

#: Idempotency-Key: 1–255 visible ASCII characters (documented in docs/api.md).
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass
class Deps:
    """Everything the operations need; built once per process by :mod:`gpufleet.api.wiring`."""

    settings: ApiSettings
    ddb: Any
    s3: Any = None
    sfn: Any = None
    batch: Any = None
    #: SQS client: a cancel nudges the on-prem node's signal queue (gpufleet.store.queues.SqsNodeSignals)
    sqs: Any = None
    clock: Clock = field(kw_only=True)
    #: Jobs and Idempotency-Key records; the DynamoDB stores over ``ddb`` unless given (tests pass
    #: the in-memory fakes of gpufleet.store.fakes).
    jobs: JobStore | None = None
    idempotency: IdempotencyStore | None = None
    #: Per-tenant request rate buckets (gpufleet.store.ratelimit).
    rate_limits: RateLimitStore | None = None
    #: The provenance index (gpufleet.store.provenance) and the watermark keys the lookup detects with
    #: (from ``settings.watermark_keys_file`` unless given).
    provenance: ProvenanceIndex | None = None
    watermark_keys: tuple = ()
    #: Reads the watermark keys on the first lookup when none are given (deployed stacks: the template's watermark
    #: secret, gpufleet.api.wiring); a ConfigError from it leaves the lookup unconfigured, the other routes untouched.
    watermark_keys_source: Callable[[], tuple] | None = None
    #: KMS client (tenants' webhook signing secrets) and the secrets' store over it
    kms: Any = None
    webhook_keys: WebhookKeyStore | None = None
    #: The scheduler's last queue view (gpufleet.store.queueview), shown on PENDING jobs.
    queue_view: QueueViewStore | None = None
    #: Tenants' webhook endpoints (gpufleet.store.webhook_endpoints).
    webhook_endpoints: WebhookEndpointStore | None = None
    #: What GPU-time attribution reads for a window (gpufleet.store.diagnosis; ``GET /v1/admin/diagnose``).
    diagnosis: DiagnosisReader | None = None
    #: The model catalog submission pins a generate job's model from (gpufleet.store.model_catalog; None: empty).
    models: ModelCatalog | None = None

    def __post_init__(self) -> None:
        if self.ddb is not None:
            if self.jobs is None:
                self.jobs = DynamoJobStore(self.ddb, self.settings.tables, self.clock)
            if self.idempotency is None:
                self.idempotency = DynamoIdempotencyStore(self.ddb, self.settings.tables.control, self.clock)
            if self.rate_limits is None:
                self.rate_limits = DynamoRateLimitStore(self.ddb, self.settings.tables.control)
            if self.queue_view is None:
                self.queue_view = DynamoQueueViewStore(self.ddb, self.settings.tables.control)
            if self.diagnosis is None:
                self.diagnosis = DynamoDiagnosisReader(self.ddb, self.settings.tables)
            if self.models is None:
                self.models = DynamoModelCatalog(self.ddb, self.settings.tables.control)
            if self.provenance is None:
                self.provenance = DynamoProvenanceIndex(self.ddb, self.settings.tables.jobs)
            if self.webhook_endpoints is None:
                self.webhook_endpoints = DynamoWebhookEndpoints(self.ddb, self.settings.tables.control)
            if self.webhook_keys is None and self.kms is not None and self.settings.webhook_key_id:
                self.webhook_keys = DynamoWebhookKeys(self.ddb, self.settings.tables.control,
                                                      KmsSecretBox(self.kms, self.settings.webhook_key_id))
        if not self.watermark_keys and self.settings.watermark_keys_file:
            from gpufleet.provenance.keys import load_watermark_keys

            self.watermark_keys = load_watermark_keys(self.settings.watermark_keys_file)

    def lookup_keys(self) -> tuple:
        """The watermark keys the provenance lookup detects with, read once from :attr:`watermark_keys_source`."""
        if not self.watermark_keys and self.watermark_keys_source is not None:
            self.watermark_keys = self.watermark_keys_source()
        return self.watermark_keys


@dataclass(frozen=True)
class HttpResult:
    status: int
    headers: dict[str, str]
    body: str
    job_id: str | None = None
    replayed: bool = False


def admit(deps: Deps, who: Principal) -> None:
    """Spend one request of the tenant's rate limit (settings ``tenant_rate_limit``/``_burst_limit``,
    per-tenant ``tenant_rate_limits``) before any work; :class:`TooManyRequests` (429, Retry-After)
    when it is spent."""
    _take(deps, who.tenant, deps.settings.rate_limit_for(who.tenant), who.tenant, "request rate limit", "tenant")


def admit_lookup(deps: Deps, who: Principal) -> None:
    """Spend one provenance lookup of the tenant's lookup bucket (settings ``tenant_lookup_rate_limit``/
    ``_burst_limit``; bucket ``RATE#<tenant>#lookup``: tenant names hold no ``#``), on top of :func:`admit`;
    429 ``rate-limited`` with ``scope: "lookup"`` when it is spent."""
    _take(deps, f"{who.tenant}#lookup", deps.settings.lookup_limit(), who.tenant, "provenance lookup limit", "lookup")


def _take(deps: Deps, bucket: str, limit, tenant: str, what: str, scope: str) -> None:
    if limit is None or deps.rate_limits is None:
        return
    wait = deps.rate_limits.take(bucket, rate=limit.rate, burst=limit.burst, now=deps.clock.now())
    if wait > 0:
        raise TooManyRequests(
            f"tenant {tenant} is over its {what} ({limit.rate:g}/s, burst {limit.burst}); retry in {wait:.2f} s",
            retry_after=max(1, math.ceil(wait)),
            limit="requests_per_second",
            limit_value=limit.rate,
            burst=limit.burst,
            scope=scope,
        )


def render_job(item: dict[str, Any]) -> str:
    return JobView.from_item(job_store.public(item)).model_dump_json()


def submit(deps: Deps, who: Principal, spec: JobSpec, idempotency_key: str | None,
           *, attrs: dict[str, Any] | None = None, fingerprint: str | None = None,
           traceparent: str | None = None) -> HttpResult:
    """``POST /v1/jobs``: idempotent, soft-quota-checked submission (202 + Location). The webhook URL
    must pass the URL policy's submit-time (syntactic) check, else 400 ``validation``; the image and
    the inputs must pass :mod:`gpufleet.api.admission`, else 403 ``not-allowed`` naming the field.
    ``attrs`` (a retry's ``retry_of``) are stored on the job; ``fingerprint`` replaces the spec's as
    the Idempotency-Key's payload hash. ``traceparent`` is the caller's W3C header: the job's trace
    (:func:`gpufleet.tracing.for_request`: the caller's trace id, or a new one) is stored on the job as
    ``traceparent`` and answered in the ``traceparent`` response header. A generate job's model must be built in or
    in the model catalog, and the job stores the content hash it runs (:func:`gpufleet.store.model_catalog.pinned_model`:
    else 400 ``validation`` naming ``workload.model``)."""
    admit_spec(deps, who, spec)
    pinned = pinned_model(deps.models, spec.workload)
    got = begin_idempotent(deps, who, idempotency_key, fingerprint or spec.fingerprint())
    if isinstance(got, idem.Replay):
        return HttpResult(got.status, dict(got.headers), got.body, got.job_id, replayed=True)
    try:
        check_soft_quota(deps, who)
        job_id = new_job_id(int(deps.clock.now() * 1000))
        trace = tracing.for_request(traceparent, deps.clock.now())
        result: dict[str, HttpResult] = {}

        def completion(item: dict[str, Any]) -> list[dict[str, Any]]:
            body = render_job(item)
            headers = {"Location": f"/v1/jobs/{job_id}", tracing.HEADER: trace}
            result["r"] = HttpResult(202, headers, body, job_id)
            return [deps.idempotency.completion(got, 202, headers, body, job_id)]

        deps.jobs.create(
            tenant=who.tenant,
            team=who.team,
            user=who.user,
            spec=spec.model_dump(mode="json", exclude_none=True),
            job_id=job_id,
            extra_items=completion,
            attrs={**(attrs or {}), **pinned, "traceparent": trace},
        )
    except BaseException:
        deps.idempotency.abandon(got)
        raise
    return result["r"]


def admit_spec(deps: Deps, who: Principal, spec: JobSpec) -> None:
    """The submit-time checks of a spec (deadline not past, webhook URL policy, image allowlist, input buckets)."""
    if spec.deadline is not None and spec.deadline.timestamp() <= deps.clock.now():
        raise BadRequest(f"deadline {spec.deadline.isoformat()} has already passed", param="deadline")
    if spec.webhook is not None:
        urlpolicy.check_submission(str(spec.webhook.url), allow_private=deps.settings.webhook_allow_private)
    admission.check_image(spec, deps.settings.image_allowlist)
    admission.check_cloud_image(spec, deps.settings.pools)
    admission.check_inputs(spec, who.tenant, deps.settings.data_buckets(),
                           set(deps.settings.tenant_buckets.get(who.tenant, ())))


def begin_idempotent(deps: Deps, who: Principal, idempotency_key: str | None, fingerprint: str):
    """Check the Idempotency-Key header and claim it (or get the replay of the first response)."""
    if idempotency_key is None or not idempotency_key.strip():
        raise BadRequest("the Idempotency-Key header is required", param="Idempotency-Key")
    if not IDEMPOTENCY_KEY.match(idempotency_key):
        raise BadRequest("Idempotency-Key must be 1-255 visible ASCII characters", param="Idempotency-Key")
    return deps.idempotency.begin(who.tenant, idempotency_key, fingerprint, wait_s=deps.settings.idempotency_wait_s)


def check_soft_quota(deps: Deps, who: Principal, adding: int = 1) -> None:
    """429 when the user or the team already has its limit of queued jobs (soft; the hard check is at
    scheduling); ``adding`` jobs (a job array) must all fit."""
    s = deps.settings
    user_n, team_n = deps.jobs.count_active(
        who.tenant,
        who.team,
        who.user,
        cap_user=s.queued_jobs_per_user,
        cap_team=s.queued_jobs_per_team,
    )
    for name, scope, current, limit in (
        ("queued_jobs_per_user", f"{who.tenant}/{who.team}/{who.user}", user_n, s.queued_jobs_per_user),
        ("queued_jobs_per_team", f"{who.tenant}/{who.team}", team_n, s.queued_jobs_per_team),
    ):
        if current + adding > limit:
            raise QuotaExceeded(
                f"{scope} already has {current} queued jobs; the limit {name} is {limit}",
                retry_after=s.quota_retry_after_s,
                limit=name,
                limit_value=limit,
                current=current,
                scope=scope,
            )


def with_members(deps: Deps, item: dict[str, Any]) -> dict[str, Any]:
    """``item`` plus ``members`` when its placement is a gang: each member's node, rank, GPUs and state, from
    the attempt item of the placement's epoch (:func:`gpufleet.nodeapi.gangstate.members_view`; a cloud gang's
    from what its Batch nodes recorded, :func:`gpufleet.gang.batch_members_view`)."""
    placement = Placement.parse(item.get("placement"))
    if placement is None or len(placement.members or ()) < 2:
        return item
    attempt = deps.jobs.get_attempt(str(item["job_id"]), placement.epoch) or {}
    if placement.target == "cloud":  # a Batch multi-node parallel job: each node records its own state
        return {**item, "members": batch_members_view(attempt, len(placement.members or ()))}
    gang = GangState.of({**attempt, "placement": attempt.get("placement") or item["placement"]})
    return {**item, "members": members_view(gang)} if gang else item


def get(deps: Deps, who: Principal, job_id: str) -> JobView:
    """``GET /v1/jobs/{id}``; a PENDING job also shows its place in the scheduler's last pass (``queue``), a
    gang its members (:func:`with_members`)."""
    item = with_members(deps, job_store.public(deps.jobs.get(job_id, who.tenant)))
    if item.get("status") == JobStatus.PENDING.value and deps.queue_view is not None:
        seen = deps.queue_view.get()
        got = seen.of(job_id) if seen else None
        if got:
            est = got["estimated_start"]
            item = {**item, "queue": {**got, "estimated_start": iso(est) if est is not None else None,
                                      "as_of": iso(got["as_of"])}}
    return JobView.from_item(item)


def list_jobs(
    deps: Deps,
    who: Principal,
    *,
    status: list[JobStatus] | None,
    created_after: datetime | None,
    created_before: datetime | None,
    limit: int,
    cursor: str | None,
    mine: bool = False,
    array_id: str | None = None,
    labels: dict[str, str] | None = None,
    user: str | None = None,
) -> JobPage:
    for name, value in (("created_after", created_after), ("created_before", created_before)):
        if value is not None and value.tzinfo is None:
            raise BadRequest(f"{name} must include a timezone (e.g. 2026-01-01T00:00:00Z)", param=name)
    if created_after and created_before and created_after >= created_before:
        raise BadRequest("created_after must be earlier than created_before", param="created_after")
    if mine and user is not None and user != who.user:
        raise BadRequest("mine=true lists your own jobs: leave user out or name yourself", param="user")
    items, nxt = deps.jobs.list(
        tenant=who.tenant,  # user= filters within the caller's tenant: it shows nothing the tenant list does not
        user=who.user if mine else user,
        secret=deps.settings.cursor_key,
        statuses=status,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        cursor=cursor,
        array_id=array_id,
        labels=labels,
    )
    return JobPage(jobs=[JobView.from_item(i) for i in items], next_cursor=nxt)


def cancel(deps: Deps, who: Principal, job_id: str) -> JobView:
    """``DELETE /v1/jobs/{id}``: mark cancel_requested (idempotent), then tell whoever holds the job. A repeated
    DELETE propagates again (a placement token or Batch job the first missed) but nudges no node: a tenant cannot make
    the platform message a node's signal queue at the API's request rate."""
    asked = iso(deps.clock.now())
    item = deps.jobs.request_cancel(
        job_id, who.tenant, requested_by=who.arn
    )
    first = str(item.get("cancel_requested_at", "")) >= asked  # set by this request (or one beside it)
    done = cancel_propagation.propagate(
        item,
        tokens=SfnTaskTokens(deps.sfn) if deps.sfn is not None else None,
        batch=AwsBatchJobs(deps.batch) if deps.batch is not None else None,
        finalize_queue=deps.settings.finalize_queue or None,
        signals=SqsNodeSignals(deps.sqs) if deps.sqs is not None else None,
        nudge=first,
    )
    log.info("cancel propagated", extra={"job_id": job_id, "actions": done.get("actions")})
    return JobView.from_item(job_store.public(item))


def events(deps: Deps, who: Principal, job_id: str) -> EventList:
    evs = deps.jobs.events(job_id, who.tenant)
    return EventList(
        job_id=job_id, events=[EventView(ts=e["ts"], type=e["type"], detail=e.get("detail") or {}) for e in evs]
    )


def logs(deps: Deps, who: Principal, job_id: str, after: str | None) -> LogPage:
    deps.jobs.get(job_id, who.tenant)
    lines, nxt = objects.read_log_chunks(
        deps.s3, deps.settings.logs_bucket, job_id, after, max_chunks=deps.settings.log_chunks_per_page
    )
    return LogPage(job_id=job_id, lines=[LogLine.model_validate(x) for x in lines], next=nxt)


def output(deps: Deps, who: Principal, job_id: str) -> OutputView:
    item = deps.jobs.get(job_id, who.tenant)
    status = item.get("status")
    out = item.get("output") or {}
    if status != JobStatus.SUCCEEDED.value or not (out.get("video_key") or out.get("kind") == "files"):
        raise InvalidTransition(
            f"job {job_id} is {status}; output is available for SUCCEEDED jobs only", current_status=status
        )
    ttl = deps.settings.presign_ttl_s
    bucket = out.get("bucket") or deps.settings.outputs_bucket
    expires_at = iso(deps.clock.now() + min(ttl, objects.MAX_PRESIGN_S))
    if out.get("kind") == "files":
        prefix = str(out["prefix"])
        listed = objects.S3JobOutputs(deps.s3, bucket).list(prefix, int(out.get("files") or 0))
        files = [OutputFile(path=key[len(prefix):], bytes=size, url=objects.presign_get(deps.s3, bucket, key, ttl))
                 for key, size in listed[: int(out.get("files") or 0)]]
        return OutputView(job_id=job_id, kind="files", files=files, total_bytes=sum(f.bytes for f in files),
                          expires_at=expires_at)
    manifest = out.get("manifest_key")
    return OutputView(
        job_id=job_id,
        video_url=objects.presign_get(deps.s3, bucket, out["video_key"], ttl),
        manifest_url=objects.presign_get(deps.s3, bucket, manifest, ttl) if manifest else None,
        expires_at=expires_at,
        watermark_payload=out.get("watermark_payload"),
    )


#: the largest mean-luma plane a lookup takes (1920×1088)
MAX_LOOKUP_PIXELS = 1920 * 1088


def provenance_lookup(deps: Deps, who: Principal, req: ProvenanceLookupRequest) -> ProvenanceLookup:
    """Detect the platform's watermark in a questioned video's mean luma and return the kept manifests of
    the SUCCEEDED jobs whose payload it carries (any tenant's manifest: it travelled with the video;
    the signed original only to its own tenant). Where the caller's own job is among them, only its own are
    returned: two jobs' 48-bit payloads can collide, and a tenant checking its own video then learns nothing of
    the other job."""
    import base64
    import binascii

    import numpy as np

    from gpufleet.provenance.watermark import detect_luma

    try:
        wm_keys = deps.lookup_keys()
    except ConfigError as err:
        log.error("provenance lookup: %s", err)
        raise Conflict("provenance lookup is not configured on this deployment (its watermark keys are unreadable)")
    if not wm_keys or deps.provenance is None:
        raise Conflict("provenance lookup is not configured on this deployment (no watermark keys)")
    admit_lookup(deps, who)  # before the detector's seconds of CPU
    if req.width * req.height > MAX_LOOKUP_PIXELS:
        raise BadRequest(f"luma plane of {req.width}x{req.height} px; at most {MAX_LOOKUP_PIXELS} px "
                         "(scale larger videos down by half)", field="width")
    try:
        raw = base64.b64decode(req.luma_b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("luma_b64 is not valid base64", field="luma_b64") from None
    if len(raw) != req.width * req.height:
        raise BadRequest(f"luma_b64 holds {len(raw)} bytes; width×height is {req.width * req.height}",
                         field="luma_b64")
    plane = np.frombuffer(raw, dtype=np.uint8).reshape(req.height, req.width)
    found = detect_luma(plane, wm_keys)
    ttl = deps.settings.presign_ttl_s
    view = ProvenanceLookup(found=found.valid, sync_z=round(found.sync_z, 2),
                            expires_at=iso(deps.clock.now() + min(ttl, objects.MAX_PRESIGN_S)))
    if not found.valid:
        return view
    view.watermark_payload, view.watermark_key_id = found.hex, found.key_id
    view.scale, view.flipped = round(found.scale, 4), found.flipped
    bucket = deps.settings.outputs_bucket
    for entry in deps.provenance.lookup(found.hex):
        try:
            job = deps.jobs.get(entry.job_id)
        except NotFound:
            continue
        if job.get("status") != JobStatus.SUCCEEDED.value:
            continue  # indexed by a Publish that did not land
        own = job.get("tenant") == who.tenant
        view.matches.append(ProvenanceMatch(
            job_id=entry.job_id, published_at=entry.published_at, watermark_key_id=entry.key_id,
            video_sha256=entry.video_sha256, own=own,
            manifest_url=objects.presign_get(deps.s3, bucket, entry.manifest_key, ttl),
            video_url=objects.presign_get(deps.s3, bucket, entry.video_key, ttl) if own else None))
    if any(m.own for m in view.matches):  # a collision of 48-bit payloads: the caller's own job is the answer
        view.matches = [m for m in view.matches if m.own]
    return view


def deliveries(deps: Deps, who: Principal, job_id: str) -> DeliveryList:
    items = deps.jobs.deliveries(job_id, who.tenant)
    return DeliveryList(job_id=job_id, deliveries=[Delivery.model_validate(i) for i in items])


def quota(deps: Deps, who: Principal) -> QuotaView:
    s = deps.settings
    user_n, team_n = deps.jobs.count_active(who.tenant, who.team, who.user)
    levels = quota_view.levels(deps.ddb, s.control_table, who)
    return QuotaView(
        tenant=who.tenant,
        team=who.team,
        user=who.user,
        levels=[QuotaLevel.model_validate(lv) for lv in levels],
        queued=QueuedLimits(
            user=user_n, team=team_n, user_limit=s.queued_jobs_per_user, team_limit=s.queued_jobs_per_team
        ),
    )


def models(deps: Deps, who: Principal) -> ModelList:
    """``GET /v1/models``: the built-in models, then the deployment's model catalog (gpufleet.store.model_catalog)."""
    builtin = [ModelView(name=n, builtin=True) for n in sorted(BUILTIN_MODELS)]
    listed = deps.models.entries() if deps.models is not None else []
    return ModelList(models=builtin + [ModelView(name=e.name, content_hash=e.content_hash, source=e.source,
                                                 files=e.files or None) for e in listed])


def pools(deps: Deps, who: Principal) -> PoolList:
    return PoolList(
        pools=[PoolView.model_validate(p) for p in quota_view.pools(deps.ddb, deps.settings.tables, deps.clock, deps.settings.pools)]
    )


def _secrets_view(tenant: str, keys: list[WebhookKey], now: float) -> WebhookSecrets:
    live = [k for k in keys if k.live(now)]
    live.sort(key=lambda k: (k.expires_at is not None, -k.created_at))
    return WebhookSecrets(tenant=tenant, secrets=[
        WebhookSecretView(id=k.id, secret=k.secret, created_at=iso(k.created_at),
                          expires_at=iso(k.expires_at) if k.expires_at is not None else None,
                          current=k.expires_at is None) for k in live])


def _webhook_keys(deps: Deps) -> WebhookKeyStore:
    if deps.webhook_keys is None:
        raise TransientError("webhook signing secrets are not configured on this deployment (GPUFLEET_WEBHOOK_KEY_ID)")
    return deps.webhook_keys


def webhook_secrets(deps: Deps, who: Principal) -> WebhookSecrets:
    """``GET /v1/webhooks/secrets``: the tenant's live signing secrets (a first one is made if it has none)."""
    keys, now = _webhook_keys(deps), deps.clock.now()
    delivery.signing_secrets(keys, who.tenant, now)
    return _secrets_view(who.tenant, keys.load(who.tenant), now)


def rotate_webhook_secret(deps: Deps, who: Principal, overlap_s: int) -> WebhookSecrets:
    """``POST /v1/webhooks/secrets/rotate``: a new current secret; the previous one keeps signing for
    ``overlap_s`` (conditional on the current secret: a concurrent rotation is a 409)."""
    keys, now = _webhook_keys(deps), deps.clock.now()
    found = keys.load(who.tenant)
    cur = webhook_key_rules.current(found)
    new = webhook_key_rules.rotated(found, delivery.new_key(now), now, overlap_s)
    keys.replace(who.tenant, new, cur.id if cur else None)
    log.info("webhook secret rotated", extra={"tenant": who.tenant, "overlap_s": overlap_s})
    return _secrets_view(who.tenant, keys.load(who.tenant), now)
