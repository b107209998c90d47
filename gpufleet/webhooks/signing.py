"""Standard Webhooks signatures (pure).

Contract:
- A secret is ``whsec_`` + base64 of 24–64 random bytes; the HMAC key is the decoded bytes.
- Headers: ``webhook-id`` (unique per message, stable across retries), ``webhook-timestamp``
  (integer seconds), ``webhook-signature`` = space-separated ``v1,<base64 HMAC-SHA256>``
  over ``"<id>.<timestamp>.<body>"``, one per signing secret (during a rotation's overlap, two).
- :func:`verify` accepts any listed v1 signature, compares in constant time and rejects
  timestamps more than ``tolerance_s`` away from ``now`` (replay protection).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from gpufleet.errors import Unauthorized, ValidationFailed

PREFIX = "whsec_"


def new_secret(rand: bytes | None = None) -> str:
    raw = rand if rand is not None else os.urandom(32)
    if not 24 <= len(raw) <= 64:
        raise ValidationFailed("webhook secret must be 24-64 bytes")
    return PREFIX + base64.b64encode(raw).decode()


def _key(secret: str) -> bytes:
    if not secret.startswith(PREFIX):
        raise ValidationFailed("webhook secret must start with whsec_")
    try:
        return base64.b64decode(secret[len(PREFIX) :], validate=True)
    except ValueError as err:
        raise ValidationFailed("webhook secret is not valid base64") from err


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of one message."""
    signed = f"{msg_id}.{int(timestamp)}.".encode() + body
    mac = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str | list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers; with several secrets (a rotation's overlap), one space-separated
    ``v1,<sig>`` per secret, the current one first."""
    secrets = [secret] if isinstance(secret, str) else list(secret)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
    }


def verify(secret: str, hdrs: dict[str, str], body: bytes, now: float, tolerance_s: int = 300) -> None:
    """Raise :class:`Unauthorized` unless ``hdrs`` carry a valid, fresh signature of ``body``."""
    lower = {k.lower(): v for k, v in hdrs.items()}
    msg_id = lower.get("webhook-id")
    ts = lower.get("webhook-timestamp")
    sigs = lower.get("webhook-signature")
    if not (msg_id and ts and sigs):
        raise Unauthorized("missing webhook headers")
    try:
        ts_i = int(ts)
    except ValueError as err:
        raise Unauthorized("bad webhook-timestamp") from err
    if abs(now - ts_i) > tolerance_s:
        raise Unauthorized("webhook-timestamp outside tolerance")
    expected = signature(secret, msg_id, ts_i, body).split(",", 1)[1]
    for candidate in sigs.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return
    raise Unauthorized("no matching webhook signature")
