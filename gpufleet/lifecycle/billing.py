"""Billing policy as data (pure).

Contract: every attempt ends with an :class:`Outcome`; the :class:`BillingPolicy`
maps it to a :class:`Rule`: ``charge`` ("attempt": that attempt's GPU-seconds at
its pool's price; "none": not charged, with the ``waiver`` reason recorded on the
job and shown through the API). :func:`charge_for` computes the amount. One ledger
entry is written per *charged* attempt (see :mod:`gpufleet.store.ledger`).

Defaults (docs/lifecycle.md has the table): succeeded → charged; system failure,
preemption, quarantine, rejected prompt, cancelled before start → not charged;
user error → that attempt charged; cancelled while running → consumed time;
output blocked by moderation → charged (the GPU work was done for the user's prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Outcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    USER_ERROR = "USER_ERROR"
    SYSTEM_FAILURE = "SYSTEM_FAILURE"
    PREEMPTED = "PREEMPTED"
    QUARANTINED = "QUARANTINED"
    CANCELLED_BEFORE_START = "CANCELLED_BEFORE_START"
    CANCELLED_RUNNING = "CANCELLED_RUNNING"
    REJECTED = "REJECTED"
    BLOCKED = "BLOCKED"
    EXPIRED = "EXPIRED"
    TIMED_OUT = "TIMED_OUT"


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    charge: Literal["attempt", "none"]
    waiver: str | None = None


def default_rules() -> dict[Outcome, Rule]:
    return {
        Outcome.SUCCEEDED: Rule(charge="attempt"),
        Outcome.USER_ERROR: Rule(charge="attempt"),
        Outcome.CANCELLED_RUNNING: Rule(charge="attempt"),
        Outcome.BLOCKED: Rule(charge="attempt"),
        # stopped at the spec's max_run_seconds: the attempt ran as long as the tenant allowed (plus the stop's grace)
        Outcome.TIMED_OUT: Rule(charge="attempt"),
        Outcome.SYSTEM_FAILURE: Rule(charge="none", waiver="system failure: not the user's fault"),
        Outcome.PREEMPTED: Rule(charge="none", waiver="attempt preempted (capacity reclaimed)"),
        Outcome.QUARANTINED: Rule(charge="none", waiver="job quarantined after crashing workers; under review"),
        Outcome.CANCELLED_BEFORE_START: Rule(charge="none", waiver="cancelled before it started"),
        Outcome.REJECTED: Rule(charge="none", waiver="prompt rejected before reaching a GPU"),
        Outcome.EXPIRED: Rule(charge="none", waiver="the deadline passed before the job started"),
    }


class BillingPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: dict[Outcome, Rule] = Field(default_factory=default_rules)
    #: smallest billable unit; partial seconds are rounded up to it
    min_gpu_seconds: float = Field(1.0, ge=0)

    def rule(self, outcome: Outcome) -> Rule:
        rule = self.rules.get(outcome)
        return rule if rule is not None else Rule(charge="none", waiver=f"no billing rule for {outcome.value}")


@dataclass(frozen=True)
class Charge:
    charged: bool
    gpu_seconds: float
    amount_usd: Decimal
    waiver: str | None
    outcome: Outcome

    def as_item(self) -> dict:
        return {
            "charged": self.charged,
            "gpu_seconds": self.gpu_seconds,
            "amount_usd": str(self.amount_usd),
            "waiver": self.waiver,
            "outcome": self.outcome.value,
        }


def gpu_seconds(wall_seconds: float, gpu_milli: int, nodes: int = 1) -> float:
    """GPU-seconds of an attempt: wall time × GPUs per node × nodes (fractional GPUs count pro rata)."""
    return max(0.0, float(wall_seconds)) * (gpu_milli / 1000.0) * max(1, nodes)


def charge_for(
    outcome: Outcome, gpu_secs: float, price_per_gpu_hour: float, policy: BillingPolicy | None = None
) -> Charge:
    """The charge of one attempt. Amount = ceil-to-``min_gpu_seconds`` GPU-seconds × price / 3600, to 1e-6 USD."""
    policy = policy or BillingPolicy()
    rule = policy.rule(outcome)
    if rule.charge == "none":
        return Charge(False, float(gpu_secs), Decimal("0"), rule.waiver, outcome)
    secs = max(0.0, float(gpu_secs))
    unit = policy.min_gpu_seconds
    if unit > 0 and secs > 0:
        units = (Decimal(str(secs)) / Decimal(str(unit))).to_integral_value(rounding=ROUND_CEILING)
        secs = float(units * Decimal(str(unit)))
    amount = (Decimal(str(secs)) * Decimal(str(price_per_gpu_hour)) / Decimal(3600)).quantize(
        Decimal("0.000001"), rounding=ROUND_HALF_UP
    )
    return Charge(True, secs, amount, None, outcome)
