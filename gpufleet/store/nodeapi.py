"""The node API as on-prem nodes reach it: a SigV4-signed HTTP client and the adapters built on it.

Contract:
- :class:`NodeApiClient` signs every request (service ``execute-api``) with the node's credentials
  (botocore's chain by default: IAM Roles Anywhere's credential process in production) and maps problem
  answers to :mod:`gpufleet.errors`: 409 ``stale-epoch`` → :class:`StaleEpoch`, 410 → :class:`TaskGone`,
  403 → :class:`NotAllowed`, 404 → :class:`NotFound`, 400 → :class:`ValidationFailed`, another 409 →
  :class:`Conflict`; 5xx, 429 and no answer are retried, then :class:`TransientError`.
- :class:`NodeApiJobItem` has the interface of :class:`gpufleet.store.jobitem.JobItem` that the runtime
  uses (``get``/``check_current`` return the node's view of the job; ``set_progress``/``heartbeat``
  return it too), each a call the server checks (assignment, epoch) before its fenced write. The
  finalize stage's writes are not a node's (it runs on Batch): ``set_finalized`` is refused.
- :func:`scoped_s3_client` is an S3 client whose credentials are the attempt's, vended by the node API
  and refreshed before they expire: it can reach only that job's prefixes.
- :func:`exchange_supervisor_token` is a cloud supervisor's first call (``POST /v1/node/cloud/credentials``,
  unsigned: it has no AWS identity before; the one-time token is the credential): the attempt's session, or the
  error the server answered (403 :class:`NotAllowed`, 409 :class:`StaleEpoch`), no retry of a refusal.
- :func:`worker_adapters` picks the runtime's adapters: through the node API when ``node_api_url`` is
  set (an on-prem node, signed with the node's credentials; or a cloud supervisor with ``supervisor_token``,
  signed with the session the token was exchanged for, renewed through its ``credentials`` route before it
  expires), else DynamoDB and S3 directly (the Batch job role). On a node its first check of the job (``view``)
  is already in flight beside the credentials' vending (:meth:`NodeApiJobItem.prefetch_view`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials, RefreshableCredentials

from gpufleet import errors
from gpufleet.runtime.overlap import Overlapped
from gpufleet.store.clients import botocore_session
from gpufleet.store.clients import client as aws_client
from gpufleet.store.objectstore import ObjectStore

_BY_TYPE = {"stale-epoch": errors.StaleEpoch, "task-gone": errors.TaskGone, "not-allowed": errors.NotAllowed,
            "forbidden": errors.NotAllowed, "not-found": errors.NotFound, "validation": errors.ValidationFailed,
            "conflict": errors.Conflict}


def _error(status: int, body: Any) -> errors.GpufleetError:
    body = body if isinstance(body, dict) else {}
    slug = str(body.get("type", "")).rsplit("/", 1)[-1]
    detail = str(body.get("detail") or body.get("title") or f"HTTP {status}")
    extra = {k: v for k, v in body.items() if k not in ("type", "title", "status", "detail", "instance")}
    cls = _BY_TYPE.get(slug)
    if cls is None:
        if status >= 500 or status == 429:
            cls = errors.TransientError
        else:
            cls = {403: errors.NotAllowed, 404: errors.NotFound, 409: errors.Conflict, 410: errors.TaskGone}.get(
                status, errors.BadRequest)
    return cls(detail, **extra)


_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


def _request(http: urllib3.PoolManager, method: str, url: str, data: bytes | None,
             headers: Callable[[], dict[str, str]], attempts: int) -> dict[str, Any]:
    """One node API request: the parsed JSON answer of a 2xx; a transient failure (unreachable, 5xx, 429) tried
    again up to ``attempts`` times with a doubling pause; any other answer raised as its error at once."""
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            raw = http.request(method, url, body=data, headers=headers(), retries=False, redirect=False)
        except urllib3.exceptions.HTTPError as exc:
            err: errors.GpufleetError = errors.TransientError(f"node API unreachable: {type(exc).__name__}")
        else:
            try:
                parsed = json.loads(raw.data or b"{}")
            except ValueError:
                parsed = {}
            if 200 <= raw.status < 300:
                return parsed
            err = _error(raw.status, parsed)
        if not isinstance(err, errors.TransientError) or attempt == attempts:
            raise err
        time.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")


class NodeApiClient:
    def __init__(self, url: str, region: str, *, credentials=None, service: str = "execute-api",
                 timeout: float = 10.0, attempts: int = 4, http: urllib3.PoolManager | None = None) -> None:
        self.url = url.rstrip("/")
        self.region = region
        self.service = service
        self.attempts = attempts
        self._creds = credentials or botocore_session().get_credentials()
        if self._creds is None:
            raise errors.ConfigError("no AWS credentials for the node API")
        self._http = http or urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=timeout))

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self.url + path
        data = json.dumps(body).encode() if body is not None else None

        def signed() -> dict[str, str]:  # signed again on every try (the signature carries the time)
            req = AWSRequest(method=method, url=url, data=data, headers=dict(_JSON_HEADERS))
            req.headers["Host"] = urlsplit(url).netloc
            SigV4Auth(self._creds.get_frozen_credentials(), self.service, self.region).add_auth(req)
            return dict(req.headers.items())

        return _request(self._http, method, url, data, signed, self.attempts)

    def attempt(self, job_id: str, epoch: int, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("POST", f"/v1/node/jobs/{quote(job_id, safe='')}/attempts/{int(epoch)}/{op}", body or {})


class NodeApiJobItem:
    """The runtime's job-item adapter on an on-prem node (see module contract)."""

    def __init__(self, api: NodeApiClient, job_id: str, epoch: int, table: str = "") -> None:
        self.api = api
        self.job_id = job_id
        self.epoch = epoch
        self.table = table
        self._first_view: Overlapped[dict[str, Any]] | None = None

    def prefetch_view(self) -> NodeApiJobItem:
        """Start the stage's first check (the ``view`` call) now, on a thread of its own: the next
        :meth:`check_current` answers with it (its item, or its error, a stale epoch included) instead of a round
        trip of its own. The runtime starts it beside the credentials' vending, the two calls the stage waits for
        before its work."""
        self._first_view = Overlapped(self.get, name="first-view")
        return self

    def get(self) -> dict[str, Any]:
        return self.api.attempt(self.job_id, self.epoch, "view")

    def check_current(self) -> dict[str, Any]:
        view, self._first_view = self._first_view, None
        if view is not None:
            return view.result()
        return self.get()  # the server refuses a stale epoch (409 → StaleEpoch)

    def set_progress(self, step: int, total: int) -> dict[str, Any]:
        return self.api.attempt(self.job_id, self.epoch, "progress", {"step": step, "total": total})

    def heartbeat(self) -> dict[str, Any]:
        return self.api.attempt(self.job_id, self.epoch, "beat")

    def task_heartbeat(self) -> dict[str, Any]:
        """The workflow's task heartbeat (the node API's ``heartbeat``: keeps a ``.waitForTaskToken`` state alive)."""
        return self.api.attempt(self.job_id, self.epoch, "heartbeat")

    def mark_running(self) -> bool:
        return bool(self.api.attempt(self.job_id, self.epoch, "running").get("moved"))

    def set_checkpoint(self, key: str, sha256: str, step: int) -> None:
        self.api.attempt(self.job_id, self.epoch, "checkpoint", {"key": key, "sha256": sha256, "step": step})

    def set_generated(self, ref: dict[str, Any]) -> None:
        self.api.attempt(self.job_id, self.epoch, "generated",
                         {k: ref[k] for k in ("key", "sha256", "files") if ref.get(k) is not None})

    def set_finalized(self, moderation: dict[str, Any], output: dict[str, Any] | None) -> None:
        raise errors.NotAllowed("the finalize stage does not run on on-prem nodes")

    def add_event(self, kind: str, detail: dict[str, Any]) -> None:
        self.api.attempt(self.job_id, self.epoch, "event", {"kind": kind, "detail": detail})

    def record_attempt(self, attrs: dict[str, Any]) -> None:
        if len(attrs) != 1 or set(attrs) - {"staging", "phases"}:
            raise errors.NotAllowed("a node records only staging or phases on its attempt, one at a time")
        ((name, value),) = attrs.items()
        self.api.attempt(self.job_id, self.epoch, name, {name: value})


def _metadata(c: dict[str, Any]) -> dict[str, str]:
    """botocore's refreshable-credential metadata of a vended session (``access_key_id``... ``expiration``)."""
    return {"access_key": c["access_key_id"], "secret_key": c["secret_access_key"], "token": c["session_token"],
            "expiry_time": datetime.fromtimestamp(float(c["expiration"]), UTC).isoformat()}


def _refreshable(first: dict[str, Any], renew) -> RefreshableCredentials:
    return RefreshableCredentials.create_from_metadata(metadata=_metadata(first),
                                                       refresh_using=lambda: _metadata(renew()),
                                                       method="gpufleet-node-api")


def scoped_s3_client(api: NodeApiClient, job_id: str, epoch: int, *, region: str, endpoint_url: str | None = None,
                     credentials: RefreshableCredentials | None = None):
    """An S3 client with the attempt's vended credentials, refreshed before they expire (``credentials``: those
    already held, e.g. a cloud supervisor's session, else vended now)."""
    session = botocore_session()
    session._credentials = credentials or _refreshable(  # noqa: SLF001 - botocore's documented way
        api.attempt(job_id, epoch, "credentials"), lambda: api.attempt(job_id, epoch, "credentials"))
    import boto3

    return aws_client("s3", region=region, endpoint_url=endpoint_url, session=boto3.Session(botocore_session=session),
                      signature_version="s3v4")


def exchange_supervisor_token(url: str, job_id: str, epoch: int, token: str, *, timeout: float = 10.0,
                              attempts: int = 4, http: urllib3.PoolManager | None = None) -> dict[str, Any]:
    """The attempt's supervisor session for its one-time ``token`` (see module contract)."""
    http = http or urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=timeout))
    body = json.dumps({"job_id": job_id, "epoch": int(epoch), "token": token}).encode()
    return _request(http, "POST", url.rstrip("/") + "/v1/node/cloud/credentials", body, lambda: dict(_JSON_HEADERS),
                    attempts)


def supervisor_client(url: str, region: str, job_id: str, epoch: int, token: str, *,
                      http: urllib3.PoolManager | None = None) -> tuple[NodeApiClient, RefreshableCredentials]:
    """A cloud supervisor's node API client: ``token`` exchanged once, the session renewed through the attempt's
    ``credentials`` route (the server allows a supervisor its own current attempt only)."""
    latest = _Session(exchange_supervisor_token(url, job_id, epoch, token, http=http))
    # the renewal is signed with the session it renews (the refreshing credentials would wait on themselves)
    renewer = NodeApiClient(url, region, credentials=latest, http=http)

    def renew() -> dict[str, Any]:
        latest.session = renewer.attempt(job_id, epoch, "credentials")
        return latest.session

    creds = _refreshable(latest.session, renew)
    return NodeApiClient(url, region, credentials=creds, http=http), creds


class _Session:
    """The latest vended session as botocore credentials (no refresh of its own)."""

    def __init__(self, session: dict[str, Any]) -> None:
        self.session = session

    def get_frozen_credentials(self) -> ReadOnlyCredentials:
        c = self.session
        return ReadOnlyCredentials(c["access_key_id"], c["secret_access_key"], c["session_token"])


def worker_adapters(*, table: str, job_id: str, epoch: int, node_api_url: str | None, node_id: str | None,
                    region: str, clock, endpoint_url: str | None = None, dynamodb=None, s3=None,
                    supervisor_token: str | None = None):
    """(job item adapter, object store) of one attempt's runtime (see module contract)."""
    if node_api_url and supervisor_token:
        api, creds = supervisor_client(node_api_url, region, job_id, epoch, supervisor_token)
        s3 = s3 or scoped_s3_client(api, job_id, epoch, region=region, endpoint_url=endpoint_url, credentials=creds)
        return NodeApiJobItem(api, job_id, epoch, table), ObjectStore(s3, node_id=node_id or "")
    if supervisor_token:
        raise errors.ConfigError("a cloud supervisor (supervisor token) needs the node API's URL")
    if node_api_url:
        api = NodeApiClient(node_api_url, region)
        job = NodeApiJobItem(api, job_id, epoch, table).prefetch_view()  # beside the credentials below
        objects = ObjectStore(s3 or scoped_s3_client(api, job_id, epoch, region=region, endpoint_url=endpoint_url),
                              node_id=node_id or "")
        return job, objects
    from gpufleet.store.jobitem import JobItem

    return JobItem(table, job_id, epoch, client=dynamodb, clock=clock), ObjectStore(s3, node_id=node_id or "")
