"""One trace per job: the W3C ``traceparent`` the API starts (or takes from the caller) at submit.

Contract (W3C Trace Context level 1, ``00-<trace id>-<parent id>-<flags>``, lower-case hex):

- :func:`for_request` — the job's traceparent for a submit request: a caller's valid ``traceparent``
  header keeps its trace id and flags with a new parent id (the API's own span); anything else (absent,
  malformed, version ``ff``, all-zero ids) starts a new trace, sampled. A new trace id begins with the
  request's epoch seconds as 8 hex digits, so the same id is an AWS X-Ray trace id
  (``1-<8 hex>-<24 hex>``, the mapping AWS's OpenTelemetry propagators use).
- :func:`trace_id` — the 32-hex trace id of a valid traceparent (what every log line of the job
  carries as ``trace_id``), else None.
- :func:`xray_header` — the ``X-Amzn-Trace-Id`` form (``Root=1-…;Parent=…;Sampled=0|1``) that
  ``StartExecution``'s ``traceHeader`` takes, so the execution, its X-Ray-traced task Lambdas and the
  API request share the trace.

The job item stores it (``traceparent``), the envelope carries it (also in pointer form), the
runtime and the on-prem agent put ``trace_id`` on every log line of the job (docs/operations.md,
"Tracing"). Pure: no I/O; randomness comes from ``rand`` (``secrets.token_hex`` by default).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: the header name (HTTP headers are case-insensitive; API Gateway hands them over lower-cased)
HEADER = "traceparent"


def _parts(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent id, flags) of a valid version-00-compatible traceparent, else None."""
    if not value:
        return None
    m = TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, tid, pid, flags = m.groups()
    if version == "ff" or tid == "0" * 32 or pid == "0" * 16:
        return None
    return tid, pid, flags


def valid(value: str | None) -> bool:
    return _parts(value) is not None


def new_trace_id(now: float, rand: Callable[[int], str] = secrets.token_hex) -> str:
    """A 32-hex trace id: epoch seconds (8 hex) then 24 random hex digits (an X-Ray-compatible id)."""
    return f"{int(now) & 0xFFFFFFFF:08x}{rand(12)}"


def for_request(header: str | None, now: float, rand: Callable[[int], str] = secrets.token_hex) -> str:
    """The job's traceparent for a submit carrying ``header`` (see the module contract)."""
    span = rand(8)
    if span == "0" * 16:  # an all-zero parent id is invalid
        span = "0" * 15 + "1"
    got = _parts(header)
    if got is not None:
        tid, _pid, flags = got
        return f"00-{tid}-{span}-{flags}"
    return f"00-{new_trace_id(now, rand)}-{span}-01"


def trace_id(traceparent: str | None) -> str | None:
    got = _parts(traceparent)
    return got[0] if got else None


def xray_header(traceparent: str | None) -> str | None:
    """``Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=<0|1>`` for a valid traceparent, else None."""
    got = _parts(traceparent)
    if got is None:
        return None
    tid, pid, flags = got
    sampled = int(flags, 16) & 1
    return f"Root=1-{tid[:8]}-{tid[8:]};Parent={pid};Sampled={sampled}"
