"""Opaque, tamper-evident pagination cursors (pure).

Contract: :func:`encode` turns a position (a small JSON-able dict) plus the
query *scope* it belongs to (tenant, user, filters) into a URL-safe token
signed with HMAC-SHA256. :func:`decode` returns the position only if the
signature verifies and the scope matches the current query; anything else
(forged, truncated, edited, used with other filters or by another tenant)
raises :class:`gpufleet.errors.BadRequest`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

from gpufleet.errors import BadRequest

_SIG_LEN = 32


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scope_digest(scope: dict[str, Any]) -> str:
    canon = json.dumps(scope, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def encode(position: dict[str, Any], scope: dict[str, Any], secret: bytes) -> str:
    """Sign ``position`` for ``scope``; the token reveals nothing it needs to hide but cannot be altered."""
    body = json.dumps({"p": position, "s": _scope_digest(scope)}, sort_keys=True, separators=(",", ":")).encode()
    sig = hmac.new(secret, body, hashlib.sha256).digest()
    return _b64e(body + sig)


def decode(token: str, scope: dict[str, Any], secret: bytes) -> dict[str, Any]:
    """Verify and open a cursor made by :func:`encode` for the same ``scope``."""
    try:
        raw = _b64d(token)
    except (binascii.Error, ValueError) as err:
        raise BadRequest("cursor is not valid", param="cursor") from err
    if len(raw) <= _SIG_LEN:
        raise BadRequest("cursor is not valid", param="cursor")
    body, sig = raw[:-_SIG_LEN], raw[-_SIG_LEN:]
    if not hmac.compare_digest(sig, hmac.new(secret, body, hashlib.sha256).digest()):
        raise BadRequest("cursor is not valid", param="cursor")
    data = json.loads(body)
    if data.get("s") != _scope_digest(scope):
        raise BadRequest("cursor belongs to a different query", param="cursor")
    pos = data.get("p")
    if not isinstance(pos, dict):
        raise BadRequest("cursor is not valid", param="cursor")
    return pos
