"""``gpufleet.Client``: the Python SDK of the gpufleet API.

Contract:
- Every request is signed with AWS SigV4 (``botocore.auth.SigV4Auth``, service ``execute-api``
  by default). Credentials come from the profile when it holds keys, else from botocore's
  credential chain (environment, shared files, SSO, instance roles), re-read on every request
  so refreshed credentials are used.
- :meth:`Client.submit` generates one ``Idempotency-Key`` per submission (or uses the caller's)
  and sends that same key on every retry, so a retried submission never creates a second job.
- Retries: connection failures, 408/425/429/5xx and a 409 "idempotency key in flight" are
  retried with full-jitter exponential backoff; a ``Retry-After`` header wins over the backoff.
  A server asking to wait longer than the policy's ``max_retry_after_s`` is not retried: the
  error is raised at once so the caller can decide.
- Errors: problem+json responses (RFC 9457) become :mod:`gpufleet.errors` types, matched by the
  problem ``type`` slug, else by HTTP status. ``detail`` is the server's one-line explanation;
  other problem members are kept in ``err.extra``.
- Results are pydantic models from :mod:`gpufleet.sdk_models`.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.session import Session as BotocoreSession
from pydantic import ValidationError

from gpufleet import errors
from gpufleet.clock import Clock, SystemClock
from gpufleet.profile import Profile, load_profile
from gpufleet.sdk_models import (
    Delivery,
    Event,
    Job,
    JobPage,
    LogPage,
    Model,
    Output,
    Pool,
    ProvenanceLookup,
    Quota,
)
from gpufleet.sdk_retry import RetryPolicy, parse_retry_after
from gpufleet.spec import JobSpec

__all__ = ["Client", "Response", "error_from_problem", "spec_error_line"]

_USER_AGENT = "gpufleet-sdk/0.1"


class Response:
    """A decoded HTTP response (status, lower-cased headers, parsed JSON body or raw bytes)."""

    __slots__ = ("status", "headers", "body", "raw")

    def __init__(self, status: int, headers: dict[str, str], raw: bytes) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.raw = raw
        self.body: Any = None
        if raw:
            try:
                self.body = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                self.body = None


def _error_classes() -> dict[str, type[errors.GpufleetError]]:
    found: dict[str, type[errors.GpufleetError]] = {}
    pending: list[type[errors.GpufleetError]] = [errors.GpufleetError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.type_slug, cls)
        pending.extend(cls.__subclasses__())
    return found


_BY_STATUS: dict[int, type[errors.GpufleetError]] = {
    400: errors.BadRequest,
    401: errors.Unauthorized,
    403: errors.Unauthorized,
    404: errors.NotFound,
    409: errors.Conflict,
    422: errors.ValidationFailed,
    429: errors.QuotaExceeded,
    502: errors.TransientError,
    503: errors.TransientError,
    504: errors.TransientError,
}


def error_from_problem(status: int, body: Any, headers: dict[str, str] | None = None) -> errors.GpufleetError:
    """Turn an error response into the matching :mod:`gpufleet.errors` instance.

    ``body`` is the parsed problem+json document (or anything else, tolerated). The returned
    error's ``status`` is the response's status.
    """
    problem = body if isinstance(body, dict) else {}
    type_url = str(problem.get("type") or "")
    slug = type_url.rstrip("/").rsplit("/", 1)[-1] if type_url else ""
    cls = _error_classes().get(slug) if slug else None
    if cls is None:
        cls = _BY_STATUS.get(status, errors.GpufleetError)
    detail = problem.get("detail") or problem.get("title") or problem.get("message") or f"HTTP {status}"
    detail = " ".join(str(detail).split())  # one line
    extra = {k: v for k, v in problem.items() if k not in {"type", "title", "status", "detail"}}
    if cls is errors.QuotaExceeded:
        retry_after = parse_retry_after((headers or {}).get("retry-after"), time.time())
        err: errors.GpufleetError = errors.QuotaExceeded(detail, retry_after=int(retry_after or 30), **extra)
    else:
        err = cls(detail, **extra)
    err.status = status
    return err


def _reason(exc: Exception) -> str:
    """A short reason for a transport failure (without urllib3's object reprs)."""
    text = str(exc)
    if text.startswith("<") and ">: " in text:
        text = text.split(">: ", 1)[1]
    return " ".join(text.split()) or type(exc).__name__


def spec_error_line(err: ValidationError) -> str:
    """One line naming the first invalid field of a spec and why."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "spec"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"invalid job spec: {where}: {first['msg']}{more}"


class Client:
    """Client of the gpufleet API.

    ``endpoint``/``region``/``credentials`` override the profile (see :mod:`gpufleet.profile`).
    ``http`` (a ``urllib3.PoolManager``), ``clock``, ``sleep`` and ``rand`` are injectable for tests.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        profile: str | Path | Profile | None = None,
        region: str | None = None,
        credentials: Credentials | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        http: urllib3.PoolManager | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if isinstance(profile, Profile):
            prof = profile
        elif endpoint is not None and profile is None:
            prof = Profile(endpoint=endpoint)
        else:
            prof = load_profile(profile)
        if endpoint is not None:
            prof = prof.model_copy(update={"endpoint": endpoint.rstrip("/")})
        if region is not None:
            prof = prof.model_copy(update={"region": region})
        self.profile = prof
        self.endpoint = prof.endpoint
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._http = http or urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=timeout))
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._rand = rand
        self._credentials = credentials or self._resolve_credentials(prof)

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _resolve_credentials(prof: Profile) -> Credentials:
        if prof.access_key_id and prof.secret_access_key:
            return Credentials(prof.access_key_id, prof.secret_access_key, prof.session_token)
        session = BotocoreSession(profile=prof.aws_profile) if prof.aws_profile else BotocoreSession()
        creds = session.get_credentials()
        if creds is None:
            raise errors.ConfigError(
                "no AWS credentials found: set them in the gpufleet profile or through the AWS credential chain"
            )
        return creds

    def _url(self, path: str, query: dict[str, Any] | None) -> str:
        url = self.endpoint + path
        if query:
            items = sorted((k, str(x)) for k, v in query.items() if v is not None
                           for x in (v if isinstance(v, list) else [v]))
            if items:
                url += "?" + urlencode(items, quote_via=quote)
        return url

    def _signed_headers(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> dict[str, str]:
        req = AWSRequest(method=method, url=url, data=data, headers=dict(headers))
        req.headers["Host"] = urlsplit(url).netloc
        frozen = self._credentials.get_frozen_credentials()
        SigV4Auth(frozen, self.profile.service, self.profile.region).add_auth(req)
        return dict(req.headers.items())

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """Send one logical request with signing and retries; return the 2xx response or raise.

        The same ``headers`` (including any Idempotency-Key) are sent on every try; the
        signature is recomputed per try (its timestamp changes).
        """
        url = self._url(path, query)
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        base = {"Accept": "application/json", "User-Agent": _USER_AGENT, **(headers or {})}
        if data is not None:
            base["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            signed = self._signed_headers(method, url, data, base)
            try:
                raw = self._http.request(method, url, body=data, headers=signed, retries=False, redirect=False)
            except urllib3.exceptions.HTTPError as exc:
                if self.retry.should_retry(None, attempt):
                    self._sleep(self.retry.delay(attempt, rand=self._rand))
                    continue
                raise errors.TransientError(f"cannot reach {self.endpoint}: {_reason(exc)}")
            resp = Response(raw.status, dict(raw.headers), raw.data)
            if 200 <= resp.status < 300:
                return resp
            problem_type = resp.body.get("type") if isinstance(resp.body, dict) else None
            retry_after = parse_retry_after(resp.headers.get("retry-after"), self._clock.now())
            too_long = retry_after is not None and retry_after > self.retry.max_retry_after_s
            if not too_long and self.retry.should_retry(resp.status, attempt, problem_type):
                self._sleep(self.retry.delay(attempt, retry_after, rand=self._rand))
                continue
            raise error_from_problem(resp.status, resp.body, resp.headers)

    def _job_path(self, job_id: str, suffix: str = "") -> str:
        return f"/v1/jobs/{quote(job_id, safe='')}{suffix}"

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: JobSpec | dict[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Submit a job; returns it as accepted (QUEUED, or the replayed first response).

        The spec is validated locally first (raises :class:`~gpufleet.errors.ValidationFailed`
        with one line naming the field). One Idempotency-Key is used for all retries.
        """
        if not isinstance(spec, JobSpec):
            try:
                spec = JobSpec.model_validate(spec)
            except ValidationError as err:
                raise errors.ValidationFailed(spec_error_line(err))
        key = idempotency_key or str(uuid.uuid4())
        resp = self.request(
            "POST", "/v1/jobs", body=spec.model_dump(mode="json", exclude_none=True), headers={"Idempotency-Key": key}
        )
        return Job.model_validate(resp.body)

    def get(self, job_id: str) -> Job:
        return Job.model_validate(self.request("GET", self._job_path(job_id)).body)

    def list(
        self,
        *,
        status: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        array_id: str | None = None,
        labels: dict[str, str] | None = None,
        user: str | None = None,
    ) -> JobPage:
        """One page of the caller's jobs, newest first (``array_id`` / ``labels``: only matching jobs; ``user``: only
        that user's, of the caller's tenant)."""
        query: dict[str, Any] = {
            "status": status,
            "created_after": created_after,
            "created_before": created_before,
            "limit": limit,
            "cursor": cursor,
            "array_id": array_id,
            "user": user,
        }
        if labels:
            query["label"] = [f"{k}={v}" for k, v in labels.items()]
        return JobPage.model_validate(self.request("GET", "/v1/jobs", query=query).body)

    def iter_jobs(self, *, max_items: int | None = None, page_size: int | None = None, **filters: Any) -> Iterator[Job]:
        """All matching jobs across pages (following the cursor), newest first."""
        cursor: str | None = None
        seen = 0
        while True:
            page = self.list(limit=page_size, cursor=cursor, **filters)
            for job in page.jobs:
                if max_items is not None and seen >= max_items:
                    return
                seen += 1
                yield job
            if not page.next_cursor or not page.jobs:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: str) -> Job:
        """Request cancellation (idempotent). Raises ``InvalidTransition``/``Conflict`` if already terminal."""
        resp = self.request("DELETE", self._job_path(job_id))
        if isinstance(resp.body, dict) and ("job_id" in resp.body or "id" in resp.body):
            return Job.model_validate(resp.body)
        return self.get(job_id)

    def events(self, job_id: str) -> list[Event]:
        body = self.request("GET", self._job_path(job_id, "/events")).body
        items = body.get("events", body.get("items", [])) if isinstance(body, dict) else body or []
        return [Event.model_validate(e) for e in items]

    def logs(self, job_id: str, *, after: str | None = None) -> LogPage:
        body = self.request("GET", self._job_path(job_id, "/logs"), query={"after": after}).body
        return LogPage.model_validate(body if isinstance(body, dict) else {"lines": body or []})

    def follow_logs(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None) -> Iterator[Any]:
        """Yield log lines as they arrive until the job is terminal and no lines remain."""
        after: str | None = None
        deadline = None if timeout is None else self._clock.now() + timeout
        while True:
            page = self.logs(job_id, after=after)
            yield from page.lines
            if page.next:
                after = page.next
            if not page.lines:
                if self.get(job_id).is_terminal:
                    last = self.logs(job_id, after=after)
                    yield from last.lines
                    return
                if deadline is not None and self._clock.now() >= deadline:
                    raise errors.WaitTimeout(f"stopped following logs of {job_id} after {timeout:g}s")
                self._sleep(poll_s)

    def output(self, job_id: str) -> Output:
        """Presigned links to the video and its C2PA manifest, or to a container job's files (SUCCEEDED jobs only)."""
        return Output.model_validate(self.request("GET", self._job_path(job_id, "/output")).body)

    def download_output(self, job_id: str, dest_dir: str | Path, output: Output | None = None) -> dict[str, Path]:
        """Download the job's video (``<job_id>.mp4``) and manifest, if any, into ``dest_dir``; for a container
        job, every file to ``<dest_dir>/<job_id>/<path>`` (keys of the result: the files' paths).

        ``output`` is a result of :meth:`output` to reuse (its links are valid for minutes).
        """
        out = output or self.output(job_id)
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        if out.kind == "files":
            root = (dest / job_id).resolve()
            files = {}
            for f in out.files:
                path = (root / f.path).resolve()
                if root not in path.parents:
                    raise errors.ValidationFailed(f"output path {f.path!r} leaves the download directory")
                path.parent.mkdir(parents=True, exist_ok=True)
                files[f.path] = (f.url, path)
        else:
            files = {"video": (out.video_url, dest / f"{job_id}.mp4")}
            if out.manifest_url:
                files["manifest"] = (out.manifest_url, dest / f"{job_id}.c2pa")
        result: dict[str, Path] = {}
        for name, (url, path) in files.items():
            try:
                raw = self._http.request("GET", url, retries=False, preload_content=True)
            except urllib3.exceptions.HTTPError as exc:
                raise errors.TransientError(f"cannot download the {name} of {job_id}: {exc}")
            if raw.status != 200:
                raise errors.TransientError(f"downloading the {name} of {job_id} failed: HTTP {raw.status}")
            tmp = path.with_suffix(path.suffix + ".part")
            tmp.write_bytes(raw.data)
            tmp.replace(path)
            result[name] = path
        return result

    def provenance_lookup(self, luma: Any) -> ProvenanceLookup:
        """Ask the platform whose video this is: ``luma`` is a questioned video's mean luma (uint8 numpy array
        (h, w), :func:`gpufleet.provenance.watermark.mean_luma`; at most 1920×1088 px). The platform detects
        its keyed watermark and returns the kept C2PA manifests of the jobs whose payload it carries."""
        import base64

        body = {"width": int(luma.shape[1]), "height": int(luma.shape[0]),
                "luma_b64": base64.b64encode(luma.tobytes()).decode()}
        return ProvenanceLookup.model_validate(self.request("POST", "/v1/provenance/lookup", body=body).body)

    def download(self, url: str, path: str | Path) -> Path:
        """Download a presigned link to ``path`` (written whole, then renamed)."""
        path = Path(path)
        try:
            raw = self._http.request("GET", url, retries=False, preload_content=True)
        except urllib3.exceptions.HTTPError as exc:
            raise errors.TransientError(f"cannot download {path.name}: {exc}")
        if raw.status != 200:
            raise errors.TransientError(f"downloading {path.name} failed: HTTP {raw.status}")
        tmp = path.with_suffix(path.suffix + ".part")
        tmp.write_bytes(raw.data)
        tmp.replace(path)
        return path

    def deliveries(self, job_id: str) -> list[Delivery]:
        """The job's webhook delivery log (``GET /v1/jobs/{id}/webhooks``): one entry per try, oldest first.

        The route is not paged. An empty list when the job has no webhook or nothing was sent yet.
        Raises :class:`~gpufleet.errors.NotFound` for an unknown job (or another tenant's).
        """
        body = self.request("GET", self._job_path(job_id, "/webhooks")).body
        items = body.get("deliveries", body.get("items", [])) if isinstance(body, dict) else body or []
        return [Delivery.model_validate(d) for d in items]

    def wait(
        self,
        job_id: str,
        timeout: float = 600.0,
        *,
        poll_s: float = 1.0,
        on_update: Callable[[Job], None] | None = None,
    ) -> Job:
        """Poll until the job is terminal; return it. Raises :class:`~gpufleet.errors.WaitTimeout`.

        ``on_update`` is called with every polled job (status and progress), e.g. for a progress bar.
        """
        deadline = self._clock.now() + timeout
        while True:
            job = self.get(job_id)
            if on_update is not None:
                on_update(job)
            if job.is_terminal:
                return job
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                raise errors.WaitTimeout(f"{job_id} is still {job.status.value} after {timeout:g}s", job_id=job_id)
            self._sleep(min(poll_s, remaining))

    # ------------------------------------------------------------------ retry, arrays, bulk cancel

    def retry_job(self, job_id: str, *, idempotency_key: str | None = None) -> Job:
        """Submit an ended job again as a new job linked by ``retry_of`` (one key for all tries)."""
        key = idempotency_key or str(uuid.uuid4())
        resp = self.request("POST", self._job_path(job_id, "/retry"), headers={"Idempotency-Key": key})
        return Job.model_validate(resp.body)

    def submit_array(self, spec: JobSpec | dict[str, Any], count: int, *, placeholder: str = "{index}",
                     idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit ``count`` jobs from one spec (``placeholder`` → the index); ``{"array_id", "count", "job_ids"}``.
        One Idempotency-Key for the whole array and all its tries."""
        doc = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, JobSpec) else dict(spec)
        key = idempotency_key or str(uuid.uuid4())
        body = {"spec": doc, "count": count, "placeholder": placeholder}
        return self.request("POST", "/v1/job-arrays", body=body, headers={"Idempotency-Key": key}).body

    def cancel_matching(self, *, array_id: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Cancel every unfinished job matching ``array_id`` and/or ``labels``; ``{"matched", "cancelled", "skipped"}``."""
        body = {k: v for k, v in {"array_id": array_id, "labels": labels}.items() if v}
        return self.request("POST", "/v1/jobs/cancel", body=body).body

    def costs(self, *, by: str = "tenant", since: str | None = None, until: str | None = None,
              label_key: str | None = None, tenant: str | None = None, csv: bool = False) -> Any:
        """The cost report (a dict), or its CSV text with ``csv=True``."""
        query = {"by": by, "since": since, "until": until, "label_key": label_key, "tenant": tenant,
                 "format": "csv" if csv else None}
        resp = self.request("GET", "/v1/costs", query=query)
        return resp.raw.decode() if csv else resp.body

    # ------------------------------------------------------------------ webhooks (tenant self-service)

    def _endpoint_path(self, endpoint_id: str) -> str:
        return f"/v1/webhooks/endpoints/{quote(endpoint_id, safe='')}"

    def create_webhook_endpoint(self, url: str, *, events: list[str] | None = None, description: str | None = None,
                                labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Register a webhook endpoint for the tenant's job events (``events``: started/progress/completed)."""
        body = {k: v for k, v in {"url": url, "events": events, "description": description,
                                  "labels": labels}.items() if v}
        return self.request("POST", "/v1/webhooks/endpoints", body=body).body

    def webhook_endpoints(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of the tenant's endpoints: ``{"endpoints", "next_cursor"}``."""
        return self.request("GET", "/v1/webhooks/endpoints", query={"limit": limit, "cursor": cursor}).body

    def iter_webhook_endpoints(self) -> Iterator[dict[str, Any]]:
        """Every endpoint of the tenant, page after page."""
        cursor = None
        while True:
            page = self.webhook_endpoints(cursor=cursor)
            yield from page["endpoints"]
            if not (cursor := page.get("next_cursor")):
                return

    def webhook_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        return self.request("GET", self._endpoint_path(endpoint_id)).body

    def set_webhook_endpoint_enabled(self, endpoint_id: str, enabled: bool) -> dict[str, Any]:
        return self.request("PATCH", self._endpoint_path(endpoint_id), body={"enabled": enabled}).body

    def delete_webhook_endpoint(self, endpoint_id: str) -> None:
        self.request("DELETE", self._endpoint_path(endpoint_id))

    def webhook_secrets(self, *, rotate: bool = False, overlap_seconds: int | None = None) -> dict[str, Any]:
        """The tenant's live signing secrets (after a rotation with ``rotate``), the current one first."""
        if rotate:
            body = {"overlap_seconds": overlap_seconds} if overlap_seconds is not None else {}
            return self.request("POST", "/v1/webhooks/secrets/rotate", body=body).body
        return self.request("GET", "/v1/webhooks/secrets").body

    # ------------------------------------------------------------------ operator recovery

    def quarantined(self, *, tenant: str | None = None, limit: int | None = None,
                    cursor: str | None = None) -> JobPage:
        return JobPage.model_validate(self.request("GET", "/v1/admin/quarantine",
                                                   query={"tenant": tenant, "limit": limit, "cursor": cursor}).body)

    def diagnose(self, *, since: str | None = None, until: str | None = None, pool: str | None = None,
                 lanes: bool = False) -> dict[str, Any]:
        """Operators: where the window's GPU time went (``GET /v1/admin/diagnose``; ``lanes``: the per-GPU timeline)."""
        query = {"since": since, "until": until, "pool": pool, "lanes": "true" if lanes else None}
        return self.request("GET", "/v1/admin/diagnose", query=query).body

    def inspect(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/admin/jobs/{quote(job_id, safe='')}").body

    def recover(self, job_id: str, action: str, reason: str | None = None) -> Job:
        """An operator action on ``job_id``: ``release``, ``cancel`` (a quarantined job) or ``refinalize``."""
        if action not in ("release", "cancel", "refinalize"):
            raise ValueError("action must be release, cancel or refinalize")
        body = {"reason": reason} if reason else None
        return Job.model_validate(self.request("POST", f"/v1/admin/jobs/{quote(job_id, safe='')}/{action}",
                                               body=body).body)

    # ------------------------------------------------------------------ fleet

    def quota(self) -> Quota:
        return Quota.model_validate(self.request("GET", "/v1/quota").body)

    def models(self) -> list[Model]:
        """The models jobs may name: the built-in ones, then the deployment's model catalog."""
        body = self.request("GET", "/v1/models").body
        items = body.get("models", []) if isinstance(body, dict) else body or []
        return [Model.model_validate(m) for m in items]

    def pools(self) -> list[Pool]:
        body = self.request("GET", "/v1/pools").body
        items = body.get("pools", body.get("items", [])) if isinstance(body, dict) else body or []
        return [Pool.model_validate(p) for p in items]
