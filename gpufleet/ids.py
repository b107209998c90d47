"""Identifiers: time-ordered job ids (ULID, Crockford base32) and helpers."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(now_ms: int | None = None, rand: bytes | None = None) -> str:
    """Return a 26-character ULID: 48-bit millisecond time + 80 random bits.

    Lexicographic order of ULIDs follows creation time (to the millisecond).
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    r = int.from_bytes(rand if rand is not None else os.urandom(10), "big")
    value = (ms << 80) | r
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_job_id(now_ms: int | None = None) -> str:
    """A job id: ``job_`` + ULID (sorts by creation time)."""
    return "job_" + ulid(now_ms).lower()


def is_job_id(value: str) -> bool:
    if not value.startswith("job_") or len(value) != 30:
        return False
    return all(c in _ALPHABET for c in value[4:].upper())
