"""Retry policy of the SDK as data, with backoff as pure functions (no I/O, no clock).

Contract:
- :func:`parse_retry_after` turns a ``Retry-After`` header (delta-seconds or an HTTP date) into
  seconds to wait, never negative; ``None`` when absent or unparseable.
- :meth:`RetryPolicy.delay` is "full jitter" exponential backoff (``uniform(0, min(cap, base*2**n))``)
  unless the server said ``Retry-After``, which wins (capped at ``max_retry_after``).
- :meth:`RetryPolicy.should_retry` says whether a response status (or a connection failure,
  ``status=None``) is worth another try for the given attempt number.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime

from pydantic import BaseModel, ConfigDict, Field

#: Statuses worth retrying: throttled, in-flight idempotent duplicate, and transient server errors.
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait according to a ``Retry-After`` header value, or ``None``.

    ``now`` is the current time (epoch seconds); it is used only for the HTTP-date form.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


class RetryPolicy(BaseModel):
    """How the SDK retries a request. Every attempt of one logical call reuses the same
    Idempotency-Key, so retrying a submission cannot create a second job."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(5, ge=1, le=20, description="total tries, including the first")
    base_s: float = Field(0.2, gt=0, description="backoff base")
    cap_s: float = Field(10.0, gt=0, description="largest backoff without Retry-After")
    max_retry_after_s: float = Field(60.0, gt=0, description="largest server-requested wait honoured")
    statuses: frozenset[int] = RETRYABLE_STATUSES

    def should_retry(self, status: int | None, attempt: int, problem_type: str | None = None) -> bool:
        """``attempt`` is 1-based (the try that just failed). ``status=None`` means no response.

        A 409 is retried only when the problem says the first request with this key is still
        in flight (a plain conflict, e.g. cancelling a finished job, is final).
        """
        if attempt >= self.max_attempts:
            return False
        if status is None:
            return True
        if status == 409:
            return bool(problem_type) and problem_type.endswith("/idempotency-in-flight")
        return status in self.statuses

    def delay(self, attempt: int, retry_after: float | None = None, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before try ``attempt + 1``; ``rand`` returns a float in [0, 1)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        ceiling = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return ceiling * rand()
