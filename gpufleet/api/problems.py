"""The one place where exceptions become HTTP responses (RFC 9457 ``application/problem+json``).

Contract: :func:`to_problem` maps any exception to ``(status, headers, body)``.
:class:`gpufleet.errors.GpufleetError` keeps its status, type slug and extra
members; request validation errors become 400 ``validation`` with the list of
field errors; anything else is a 500 ``internal`` whose detail reveals nothing.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.errors import GpufleetError, QuotaExceeded, ValidationFailed

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


def to_problem(exc: BaseException, instance: str | None = None) -> tuple[int, dict[str, str], str]:
    """Map ``exc`` to a problem response: (status, headers, JSON body)."""
    err = exc if isinstance(exc, GpufleetError) else GpufleetError("an internal error occurred")
    headers = {"Content-Type": PROBLEM_JSON}
    if isinstance(err, QuotaExceeded):
        headers["Retry-After"] = str(int(err.retry_after))
    body = err.problem(instance)
    return err.status, headers, json.dumps(body, default=str, separators=(",", ":"))
