"""What request bodies the API takes: JSON, UTF-8, bounded in size and depth, strictly parsed.

Contract:
- :func:`check` looks at a REST proxy event before it is resolved and raises a
  :class:`gpufleet.errors.GpufleetError` (a 4xx) for a body the API will not
  read, in this order: over :data:`MAX_BYTES` (or the route's :data:`MAX_BYTES_BY_PATH`) → 413
  ``payload-too-large``; then,
  for a non-empty body of a POST, PUT or PATCH, a ``Content-Type`` other than
  JSON (``application/json``, any parameters; absent means JSON) →
  415 ``unsupported-media-type``; bytes that are not UTF-8 → 400 ``validation``;
  text that :func:`loads` refuses → 400 ``validation``. Every validation
  problem names ``field: body`` in ``errors``.
- :func:`loads` is the one JSON parser of request bodies (the resolver uses it
  too): RFC 8259 JSON only — no ``NaN``/``Infinity``, no duplicate member names,
  integers of at most :data:`MAX_INT_DIGITS` digits, nesting at most
  :data:`MAX_DEPTH` deep. It never raises anything but
  :class:`gpufleet.errors.ValidationFailed` (a parser's ``RecursionError`` on
  deep input included).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from gpufleet.errors import PayloadTooLarge, UnsupportedMediaType, ValidationFailed

#: Larger request bodies are refused with 413 before they are parsed (a valid job spec is at most
#: LIMITS["spec_max_bytes"] serialized; this leaves room for formatting).
MAX_BYTES = 256 * 1024
#: Routes that take a larger body: ``POST /v1/provenance/lookup`` carries a mean-luma plane (uint8,
#: base64) of up to 1920×1088 px; 3.5 MiB stays under Lambda's 6 MB synchronous payload.
MAX_BYTES_BY_PATH = {"/v1/provenance/lookup": 3_670_016}
#: Deepest nesting of arrays and objects accepted (a job spec nests 6 deep).
MAX_DEPTH = 32
#: Longest integer literal accepted (every integer limit of a job spec has at most 10 digits).
MAX_INT_DIGITS = 64
#: Methods whose body the API reads; the body of any other method is ignored, as before.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _invalid(message: str) -> ValidationFailed:
    return ValidationFailed(f"body: {message}", errors=[{"field": "body", "message": message}])


def _no_constant(name: str) -> Any:
    raise _invalid(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _invalid(f"an integer literal has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _invalid(f"duplicate member name {k[:64]!r}")
        out[k] = v
    return out


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value (iterative: deep input cannot exhaust the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((c, d + 1) for c in children)
    return deepest


def loads(text: str | bytes) -> Any:
    """Parse a request body strictly (see module doc); :class:`ValidationFailed` otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _invalid(f"not valid UTF-8 (byte {err.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_int, object_pairs_hook=_object)
    except ValidationFailed:
        raise
    except RecursionError:
        raise _invalid(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        raise _invalid(f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None
    except ValueError as err:  # e.g. a number the parser cannot convert
        raise _invalid(f"not valid JSON: {err}") from None
    if _depth(value) > MAX_DEPTH:
        raise _invalid(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _raw(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    if not event.get("isBase64Encoded"):
        return body.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(body, validate=False)
    except (binascii.Error, ValueError):
        raise _invalid("not valid base64 (isBase64Encoded)") from None


def _media_type(headers: dict[str, Any]) -> str:
    for k, v in headers.items():
        if k.lower() == "content-type":
            return str(v).split(";", 1)[0].strip().lower()
    return ""


def is_json(media_type: str) -> bool:
    """Whether the API reads a body of this media type (``""``: none given, taken as JSON)."""
    if not media_type:
        return True
    return media_type == "application/json"


def check(event: dict[str, Any]) -> None:
    """Refuse a body the API will not read (see module doc); return None when it may be resolved."""
    raw = _raw(event)
    limit = MAX_BYTES_BY_PATH.get(str(event.get("path") or ""), MAX_BYTES)
    if len(raw) > limit:
        raise PayloadTooLarge(f"the request body is {len(raw)} bytes; at most {limit}", field="body", limit=limit)
    if not raw or str(event.get("httpMethod", "")).upper() not in BODY_METHODS:
        return
    media = _media_type(event.get("headers") or {})
    if not is_json(media):
        raise UnsupportedMediaType(
            f"the request body must be application/json, not {media[:100]}", field="Content-Type", accepted=["application/json"]
        )
    loads(raw)
