"""What to do after a failed attempt (pure).

Contract: :func:`decide` maps (retry accounting so far, the classified failure,
the policy, a uniform draw) to a :class:`Decision`. Rules, in order:

1. CANCELLED → ``cancelled``.
2. USER → ``fail`` (retrying a user error cannot help; that attempt is charged).
3. PREEMPTED → ``retry`` after ``preemption_wait_s``; the failure budget is untouched.
   Only ``max_preemptions`` stops it (then ``fail``).
4. SYSTEM → the worker joins ``crashed_workers``; when the set reaches
   ``quarantine_after_workers`` → ``quarantine``; else when system failures exceed
   ``failure_budget`` → ``fail``; else ``retry`` with full-jitter backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpufleet.lifecycle.billing import Outcome
from gpufleet.lifecycle.classify import Failure
from gpufleet.lifecycle.retry import RetryPolicy, backoff_seconds
from gpufleet.status import FailureClass, JobStatus

Action = Literal["retry", "fail", "quarantine", "cancelled"]


@dataclass(frozen=True)
class Accounting:
    """Retry accounting kept on the job item."""

    system_failures: int = 0
    preemptions: int = 0
    crashed_workers: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Decision:
    action: Action
    wait_seconds: int
    accounting: Accounting
    reason: str
    #: billing outcome of the failed attempt
    outcome: Outcome

    @property
    def terminal_status(self) -> JobStatus | None:
        return {
            "fail": JobStatus.FAILED,
            "quarantine": JobStatus.QUARANTINED,
            "cancelled": JobStatus.CANCELLED,
        }.get(self.action)


def decide(acc: Accounting, failure: Failure, policy: RetryPolicy, u: float, *, started: bool) -> Decision:
    """Decide the next step. ``started`` says whether the attempt reached a GPU (for cancel billing)."""
    if failure.cls is FailureClass.CANCELLED:
        outcome = Outcome.CANCELLED_RUNNING if started else Outcome.CANCELLED_BEFORE_START
        return Decision("cancelled", 0, acc, failure.reason, outcome)
    if failure.cls is FailureClass.USER:
        return Decision("fail", 0, acc, failure.reason, Outcome.USER_ERROR)
    if failure.cls is FailureClass.PREEMPTED:
        new = Accounting(acc.system_failures, acc.preemptions + 1, acc.crashed_workers)
        if new.preemptions > policy.max_preemptions:
            return Decision("fail", 0, new, f"preempted {new.preemptions} times", Outcome.PREEMPTED)
        return Decision("retry", int(round(policy.preemption_wait_s)), new, failure.reason, Outcome.PREEMPTED)
    crashed = acc.crashed_workers | ({failure.worker} if failure.worker else frozenset())
    new = Accounting(acc.system_failures + 1, acc.preemptions, frozenset(crashed))
    if len(crashed) >= policy.quarantine_after_workers:
        return Decision(
            "quarantine", 0, new, f"crashed {len(crashed)} distinct workers: {failure.reason}", Outcome.QUARANTINED
        )
    if new.system_failures > policy.failure_budget:
        return Decision(
            "fail", 0, new, f"failure budget of {policy.failure_budget} spent: {failure.reason}", Outcome.SYSTEM_FAILURE
        )
    wait = backoff_seconds(new.system_failures - 1, u, policy)
    return Decision("retry", int(round(wait)), new, failure.reason, Outcome.SYSTEM_FAILURE)
