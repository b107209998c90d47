"""Retry policy as data, and backoff with full jitter as a pure function.

Contract:
- :class:`RetryPolicy` is a validated settings model; every limit of the retry
  behaviour lives here (documented in docs/lifecycle.md).
- :func:`backoff_seconds` is pure: the caller passes the random draw ``u`` in
  ``[0, 1)``. Full jitter (AWS Architecture Blog, "Exponential Backoff And
  Jitter"): ``u * min(cap, base * 2**n)``, never below ``floor``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RetryPolicy(BaseModel):
    """How failed attempts are retried.

    - ``failure_budget``: system failures tolerated; the next one fails the job.
    - ``quarantine_after_workers``: a job whose attempts crashed this many
      *distinct* workers is poison and is QUARANTINED (checked before the budget).
    - ``max_preemptions``: preemptions never consume the failure budget; this cap
      only stops a job from bouncing forever.
    - backoff for system failures: full jitter over ``base_s * 2**n`` capped at ``cap_s``;
      preemptions wait ``preemption_wait_s`` (the capacity is usually elsewhere at once).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_budget: int = Field(3, ge=0, le=100)
    quarantine_after_workers: int = Field(3, ge=1, le=100)
    max_preemptions: int = Field(20, ge=0, le=1000)
    base_s: float = Field(2.0, gt=0, le=3600)
    cap_s: float = Field(300.0, gt=0, le=86400)
    floor_s: float = Field(0.0, ge=0, le=3600)
    preemption_wait_s: float = Field(0.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        if self.cap_s < self.base_s:
            raise ValueError("cap_s must be at least base_s")
        if self.floor_s > self.cap_s:
            raise ValueError("floor_s must not exceed cap_s")
        return self


def backoff_seconds(n: int, u: float, policy: RetryPolicy) -> float:
    """Wait before retry number ``n`` (0-based) given a uniform draw ``u`` in [0, 1).

    Result is in ``[floor_s, min(cap_s, base_s * 2**n)]``, monotone in ``u``.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not 0.0 <= u < 1.0:
        raise ValueError("u must be in [0, 1)")
    # 2**n overflows float for huge n; the cap makes larger exponents irrelevant.
    ceiling = policy.cap_s if n >= 63 else min(policy.cap_s, policy.base_s * (2.0**n))
    return max(policy.floor_s, u * ceiling)
