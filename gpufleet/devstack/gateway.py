"""Local HTTP gateway: what API Gateway (REST, AWS_IAM auth, Lambda proxy) does, on 127.0.0.1.

Contract:
- :class:`Gateway` listens on 127.0.0.1 only. Every request must carry an AWS
  SigV4 ``Authorization`` header whose signature botocore recomputes to the same
  value from the locally configured secret of its access key, for service
  ``execute-api`` (configurable) and the gateway's region, with ``X-Amz-Date``
  within 5 minutes and the body hash included. The signature always covers the
  SHA-256 of the body received: a signed ``x-amz-content-sha256`` must be that
  hash (``UNSIGNED-PAYLOAD`` or any other value is refused). A missing,
  malformed, forged or stale signature, or an unknown access key, gets 403 and
  never reaches the handler. Except the ``open_routes`` (method, path) — API Gateway's methods without
  authorization, e.g. the node API's supervisor-token exchange — which reach the handler unsigned, with no
  ``userArn``. An access key the gateway was not given may be resolved (``resolve``: :func:`moto_sessions`, the
  STS sessions moto vended for named roles, with their ``assumed-role`` ARN, as IAM auth accepts them).
- The body is read only with a valid ``Content-Length`` of at most
  :data:`MAX_BODY` bytes: a negative or malformed length is a 400, a body
  without a length (``Transfer-Encoding``) a 411, a longer one a 413, each a
  problem+json answered before the body is read (the connection is then closed).
- A verified request becomes an API Gateway REST proxy event
  (:func:`build_event`) whose ``requestContext.identity.userArn`` is the ARN
  configured for the access key (every local principal's: :class:`CredentialBook`), and is passed to the same handler the Lambda
  runs. Its proxy response is written back as the HTTP response.
- Requests are received concurrently, but the handler runs one event at a
  time, like one warm Lambda container: Powertools' resolver keeps the current
  event in a class attribute (``BaseRouter.current_event``), so two resolvers
  in one process must not run at once. Signature checks run outside the lock.
- ``foreground`` (optional): a context manager factory each request runs inside, from its arrival to its
  answer (the dev stack's :meth:`gpufleet.local.foreground.ForegroundGate.foreground`: background work
  waits while a request is being answered).
- ``share_port``: the port is bound with ``SO_REUSEPORT``, so several gateway processes (each one handler
  call at a time) can listen on one port and the kernel spreads connections over them (the dev stack's API
  processes, :mod:`gpufleet.devstack.api_process`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from pydantic import BaseModel, ConfigDict

from gpufleet.errors import BadRequest, GpufleetError, LengthRequired, PayloadTooLarge, Unauthorized

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
MAX_SKEW_S = 300
#: 4 MiB: above the API's largest body (a provenance lookup's 3.5 MiB luma plane); API Gateway takes 10 MB
MAX_BODY = 4 << 20
#: A declared body over MAX_BODY but at most this long is read and discarded (in small chunks, never
#: kept) before the 413, so that the client, still sending, reads the answer instead of a reset.
DRAIN_MAX = 16 << 20
_KEY_ID = re.compile(r"^[A-Z0-9]{16,128}$")
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<akid>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/"
    r"(?P<service>[^/,\s]+)/aws4_request,\s*SignedHeaders=(?P<signed>[a-z0-9;\-]+),\s*Signature=(?P<sig>[0-9a-f]{64})$"
)


class LocalCredential(BaseModel):
    """One locally configured access key and the IAM principal it stands for."""

    model_config = ConfigDict(frozen=True)

    access_key_id: str
    secret_access_key: str
    principal_arn: str
    session_token: str | None = None


class _BodyBoundSigV4(SigV4Auth):
    """SigV4 whose canonical request always carries the SHA-256 of the body received (never
    ``UNSIGNED-PAYLOAD``, whatever the URL scheme or request context say)."""

    def payload(self, request: AWSRequest) -> str:
        body = request.body or b""
        return hashlib.sha256(body if isinstance(body, bytes) else str(body).encode()).hexdigest()


#: resolves an access key the book does not hold (e.g. an STS session vended meanwhile), or None
Resolver = Callable[[str], "LocalCredential | None"]


class CredentialBook:
    """The access keys a gateway accepts: those it was given (and added since), plus any ``<key id>.json`` in
    ``directory`` (read when a key is first seen, so keys added by another process work at once), plus what
    ``resolve`` finds for a key still unknown (:func:`moto_sessions`: the sessions STS vended for given roles)."""

    def __init__(self, fixed: Iterable[LocalCredential], directory: Path | None = None,
                 resolve: Resolver | None = None) -> None:
        self._keys = {c.access_key_id: c for c in fixed}
        self.directory = directory
        self.resolve = resolve

    def __setitem__(self, key: str, cred: LocalCredential) -> None:
        self._keys[key] = cred

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str) -> LocalCredential | None:
        found = self._keys.get(key)
        if found is not None or not _KEY_ID.match(key or ""):
            return found
        cred = self._stored(key) if self.directory is not None else None
        if cred is None and self.resolve is not None:
            cred = self.resolve(key)
        if cred is None or cred.access_key_id != key:
            return None
        self._keys[key] = cred
        return cred

    def _stored(self, key: str) -> LocalCredential | None:
        try:
            return LocalCredential.model_validate(json.loads((self.directory / f"{key}.json").read_text()))
        except (OSError, ValueError):
            return None


def moto_sessions(role_arns: Iterable[str], account: str, partition: str = "aws") -> Resolver:
    """A :data:`Resolver` of the sessions moto's STS (in this process) vended for ``role_arns``: what API
    Gateway's IAM auth accepts for a role's session, with its ``assumed-role`` ARN (the dev stack's cloud
    supervisors: their session comes from the node API's token exchange, never from the book)."""
    roles = frozenset(role_arns)

    def resolve(key: str) -> LocalCredential | None:
        from moto.sts.models import sts_backends

        found = sts_backends[account][partition].get_assumed_role_from_access_key(key)
        if found is None or found.role_arn not in roles:
            return None
        return LocalCredential(access_key_id=found.access_key_id, secret_access_key=found.secret_access_key,
                               principal_arn=found.arn, session_token=found.session_token)

    return resolve


@dataclass(frozen=True)
class Verified:
    access_key_id: str
    principal_arn: str


def verify_sigv4(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    credentials: dict[str, LocalCredential] | CredentialBook,
    *,
    region: str,
    service: str = "execute-api",
    now: datetime | None = None,
) -> Verified:
    """Check the SigV4 signature of a request (see module doc); raise :class:`Unauthorized` otherwise."""
    lower = {k.lower(): v for k, v in headers.items()}
    lower.setdefault("host", urlsplit(url).netloc)
    m = _AUTH.match(lower.get("authorization", "").strip())
    if not m:
        raise Unauthorized("missing or malformed SigV4 Authorization header")
    cred = credentials.get(m["akid"])
    if cred is None:
        raise Unauthorized("the security token included in the request is invalid")
    if m["region"] != region or m["service"] != service:
        raise Unauthorized("credential scope does not match this API")
    amz_date = lower.get("x-amz-date", "")
    try:
        ts = datetime.strptime(amz_date, SIGV4_TIMESTAMP).replace(tzinfo=UTC)
    except ValueError as err:
        raise Unauthorized("missing or malformed X-Amz-Date") from err
    if ts.strftime("%Y%m%d") != m["date"]:
        raise Unauthorized("credential scope date does not match X-Amz-Date")
    if abs(((now or datetime.now(UTC)) - ts).total_seconds()) > MAX_SKEW_S:
        raise Unauthorized("signature expired: X-Amz-Date is too far from the server time")
    signed = m["signed"].split(";")
    if "host" not in signed:
        raise Unauthorized("the host header must be signed")
    if cred.session_token is not None and lower.get("x-amz-security-token") != cred.session_token:
        raise Unauthorized("the security token included in the request is invalid")
    missing = [h for h in signed if h not in lower]
    if missing:
        raise Unauthorized(f"signed header(s) not present: {', '.join(missing)}")
    if "x-amz-content-sha256" in signed and not hmac.compare_digest(
        lower["x-amz-content-sha256"].strip().lower(), hashlib.sha256(body).hexdigest()
    ):
        raise Unauthorized("the body does not match the signed x-amz-content-sha256")
    req = AWSRequest(method=method, url=url, data=body, headers={h: lower[h] for h in signed})
    req.context["timestamp"] = amz_date
    auth = _BodyBoundSigV4(Credentials(cred.access_key_id, cred.secret_access_key, cred.session_token), service, region)
    canonical = auth.canonical_request(req)
    expected = auth.signature(auth.string_to_sign(req, canonical), req)
    if auth.signed_headers(auth.headers_to_sign(req)) != m["signed"] or not hmac.compare_digest(expected, m["sig"]):
        raise Unauthorized("the request signature we calculated does not match the signature you provided")
    return Verified(access_key_id=cred.access_key_id, principal_arn=cred.principal_arn)


def build_event(
    method: str,
    raw_path: str,
    headers: dict[str, str],
    body: bytes,
    *,
    user_arn: str | None,
    access_key: str | None = None,
    source_ip: str = "127.0.0.1",
    stage: str = "local",
) -> dict[str, Any]:
    """An API Gateway REST (v1) Lambda proxy event for the request."""
    parts = urlsplit(raw_path)
    multi = parse_qs(parts.query, keep_blank_values=True)
    try:
        text, b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, b64 = base64.b64encode(body).decode(), True
    return {
        "resource": parts.path,
        "path": parts.path,
        "httpMethod": method,
        "headers": dict(headers),
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in multi.items()} or None,
        "multiValueQueryStringParameters": multi or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": parts.path,
            "httpMethod": method,
            "path": f"/{stage}{parts.path}",
            "stage": stage,
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(datetime.now(UTC).timestamp() * 1000),
            "identity": {
                "userArn": user_arn,
                "user": user_arn.rsplit("/", 1)[-1] if user_arn else None,
                "caller": access_key,
                "accessKey": access_key,
                "sourceIp": source_ip,
            },
        },
        "body": (text if body else None),
        "isBase64Encoded": b64,
    }


def body_length(headers: Iterable[tuple[str, str]]) -> int:
    """The body length a request declares, checked before anything is read.

    No ``Content-Length`` and no ``Transfer-Encoding``: no body (0). A ``Transfer-Encoding``
    (a body of unknown length) → :class:`LengthRequired`; a length that is not a non-negative
    decimal integer (or several that disagree) → :class:`BadRequest`; over :data:`MAX_BODY` →
    :class:`PayloadTooLarge`.
    """
    lower: dict[str, list[str]] = {}
    for k, v in headers:
        lower.setdefault(k.lower(), []).append(v)
    if "transfer-encoding" in lower:
        raise LengthRequired("a request body needs a Content-Length (chunked transfer is not accepted)")
    values = {v.strip() for raw in lower.get("content-length", []) for v in raw.split(",")}
    if not values:
        return 0
    if len(values) != 1 or not next(iter(values)).isdigit() or not next(iter(values)).isascii():
        raise BadRequest("Content-Length must be one non-negative integer", param="Content-Length")
    length = int(next(iter(values)))
    if length > MAX_BODY:
        raise PayloadTooLarge(
            f"the request body is {length} bytes; this gateway accepts at most {MAX_BODY}", field="body", limit=MAX_BODY
        )
    return length


def problem_response(err: GpufleetError, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """A problem+json answer of the gateway itself (403 signature, 400/411/413 framing)."""
    payload = json.dumps(err.problem(urlsplit(path).path)).encode()
    return err.status, [("Content-Type", "application/problem+json")], payload


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # bursts of concurrent clients (the default backlog is 5)
    daemon_threads = True


class _SharedPortServer(_Server):
    allow_reuse_port = True  # SO_REUSEPORT: the kernel spreads connections over the processes on the port



class AnsweringHandler(BaseHTTPRequestHandler):
    """A loopback HTTP/1.1 request handler whose subclass defines ``_any`` (every method, GET, TRACE, QUERY,
    ..., reaches it: routes it does not have get a 404 problem there) and answers with :meth:`_answer`;
    nothing is logged to stderr."""

    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes, close: bool = False) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):
            return self._any
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

class Gateway:
    """A loopback HTTP server in front of a Lambda proxy handler; use as a context manager.

    ``handler_factory`` is called once, on the first request (a cold start);
    ``credentials`` are the access keys it accepts, with any stored in ``credentials_dir`` since
    (:class:`CredentialBook`; ``gpufleet dev principal add``). ``url`` is the base URL once started.
    """

    def __init__(
        self,
        handler_factory: Callable[[], Handler],
        credentials: list[LocalCredential],
        *,
        region: str = "us-east-1",
        service: str = "execute-api",
        port: int = 0,
        credentials_dir: Path | None = None,
        open_routes: Iterable[tuple[str, str]] = (),
        resolve: Resolver | None = None,
        foreground: Callable[[], AbstractContextManager[Any]] | None = None,
        share_port: bool = False,
    ) -> None:
        self.handler_factory = handler_factory
        self.foreground = foreground or nullcontext
        self.credentials = CredentialBook(credentials, credentials_dir, resolve)
        #: (method, path) served without a signature (API Gateway's ``AuthorizationType: NONE`` methods); the
        #: handler gets no ``userArn``
        self.open_routes = frozenset(open_routes)
        self.region = region
        self.service = service
        self._lock = threading.Lock()
        self._handler_fn: Handler | None = None
        server = _SharedPortServer if share_port else _Server
        self._server = server(("127.0.0.1", port), self._request_class())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._handler_fn is None:
                self._handler_fn = self.handler_factory()
            return self._handler_fn(event, None)

    def serve(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Verify, build the event, call the handler; return (status, headers, body)."""
        with self.foreground():
            return self._serve(method, raw_path, headers, body)

    def _serve(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        host = {k.lower(): v for k, v in headers.items()}.get("host", "")
        if (method, urlsplit(raw_path).path) in self.open_routes:
            return self._respond(build_event(method, raw_path, headers, body, user_arn=None))
        try:
            who = verify_sigv4(
                method,
                f"http://{host}{raw_path}",
                headers,
                body,
                self.credentials,
                region=self.region,
                service=self.service,
            )
        except Unauthorized as err:
            return problem_response(err, raw_path)
        event = build_event(method, raw_path, headers, body, user_arn=who.principal_arn, access_key=who.access_key_id)
        return self._respond(event)

    def _respond(self, event: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        resp = self._invoke(event)
        out_headers: list[tuple[str, str]] = []
        for k, v in (resp.get("headers") or {}).items():
            out_headers.append((k, str(v)))
        for k, vs in (resp.get("multiValueHeaders") or {}).items():
            if k not in (resp.get("headers") or {}):
                out_headers += [(k, str(v)) for v in vs]
        raw = resp.get("body") or ""
        data = base64.b64decode(raw) if resp.get("isBase64Encoded") else raw.encode()
        return int(resp.get("statusCode", 502)), out_headers, data

    def _request_class(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class _Req(AnsweringHandler):

            def _any(self) -> None:
                try:
                    length = body_length(self.headers.items())
                except GpufleetError as err:  # refused before reading: the unread body ends the connection
                    self.close_connection = True
                    if isinstance(err, PayloadTooLarge):
                        self._discard()
                    self._answer(*problem_response(err, self.path), close=True)
                    return
                body = self.rfile.read(length) if length else b""
                try:
                    status, headers, data = gateway.serve(self.command, self.path, dict(self.headers.items()), body)
                except Exception as exc:  # the handler crashed: API Gateway answers 502
                    status, headers = 502, [("Content-Type", "application/problem+json")]
                    data = json.dumps(
                        {
                            "type": "about:blank",
                            "title": "Bad gateway",
                            "status": 502,
                            "detail": f"handler failed: {type(exc).__name__}",
                        }
                    ).encode()
                self._answer(status, headers, data)

            def _discard(self) -> None:
                """Read and drop an oversize body up to DRAIN_MAX (see there); never buffers it."""
                left = int(self.headers.get("Content-Length", "0").strip() or 0)
                if left > DRAIN_MAX:
                    return
                try:
                    self.connection.settimeout(5)
                    while left > 0:
                        chunk = self.rfile.read(min(left, 1 << 16))
                        if not chunk:
                            break
                        left -= len(chunk)
                except OSError:
                    pass

        return _Req

    def start(self) -> Gateway:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpufleet-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
