"""The one place where exceptions become HTTP responses (RFC 9457 ``application/problem+json``).

Contract: :func:`as_error` turns any exception into the
:class:`gpufleet.errors.GpufleetError` it answers as, and :func:`to_problem`
maps it to ``(status, headers, body)``:
- a :class:`GpufleetError` keeps its status, type slug and extra members; a 400
  ``validation`` always carries ``errors: [{field, message}]`` (one entry built
  from its ``field`` or ``body`` and its detail when the raiser gave none);
- the resolver's request validation errors become 400 ``validation`` with the
  list of field errors, its unsupported-content-type error a 415
  ``unsupported-media-type``;
- anything else is a 500 ``internal`` whose detail reveals nothing.
A 429 (quota or rate limit) carries ``Retry-After``.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)

from gpufleet.errors import GpufleetError, QuotaExceeded, TooManyRequests, UnsupportedMediaType, ValidationFailed

PROBLEM_JSON = "application/problem+json"


def _field_errors(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for e in errors[:20]:
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body",)]
        out.append({"field": ".".join(loc) or "body", "message": str(e.get("msg", "invalid"))})
    return out


def validation_problem(errors: list[dict[str, Any]]) -> ValidationFailed:
    fields = _field_errors(errors)
    first = fields[0] if fields else {"field": "body", "message": "invalid"}
    more = f" (and {len(fields) - 1} more)" if len(fields) > 1 else ""
    return ValidationFailed(f"{first['field']}: {first['message']}{more}", errors=fields)


def as_error(exc: BaseException) -> GpufleetError:
    """The error ``exc`` answers as (see module doc); a plain GpufleetError means a 500."""
    if isinstance(exc, RequestUnsupportedContentType):  # before RequestValidationError: not a subclass, but
        return UnsupportedMediaType(                     # both are ValidationExceptions
            "the request body must be application/json", field="Content-Type", accepted=["application/json"]
        )
    if isinstance(exc, RequestValidationError):
        return validation_problem(list(exc.errors()))
    if isinstance(exc, ValidationFailed) and not exc.extra.get("errors"):
        field = str(exc.extra.get("field") or "body")
        exc.extra["errors"] = [{"field": field, "message": exc.detail}]
        return exc
    if isinstance(exc, GpufleetError):
        return exc
    return GpufleetError("an internal error occurred")


def to_problem(exc: BaseException, instance: str | None = None) -> tuple[int, dict[str, str], str]:
    """Map ``exc`` to a problem response: (status, headers, JSON body)."""
    err = as_error(exc)
    headers = {"Content-Type": PROBLEM_JSON}
    if isinstance(err, (QuotaExceeded, TooManyRequests)):
        headers["Retry-After"] = str(max(1, int(err.retry_after)))
    body = err.problem(instance)
    return err.status, headers, json.dumps(body, default=str, separators=(",", ":"))
