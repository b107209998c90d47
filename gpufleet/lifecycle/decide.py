"""What to do after a failed attempt (pure).

Contract: :func:`decide` maps (retry accounting so far, the classified failure,
the policy, a uniform draw) to a :class:`Decision`. Rules, in order:

1. CANCELLED → ``cancelled``; EXPIRED (the deadline passed before a start) → ``expired``;
   TIMED_OUT (the attempt ran past the spec's ``max_run_seconds`` and was stopped) → ``fail`` with
   outcome TIMED_OUT (charged for the attempt, at most ``max_run_seconds``; never retried: another attempt
   would hit the same limit).
2. USER → ``fail`` (retrying a user error cannot help; that attempt is charged).
   A SYSTEM failure with a crash ``fingerprint`` (gpufleet.crash: same exit code, same normalized
   last lines) already recorded in ``crashes`` for a *different* worker is a deterministic crash
   of the job's own spec: ``fail`` as USER_ERROR (charged by the billing policy), without using
   the failure budget. The same fingerprint on the same worker proves nothing (the node may be
   broken) and stays SYSTEM.
3. PREEMPTED → ``retry`` after ``preemption_wait_s``; the failure budget is untouched.
   Only ``max_preemptions`` stops it (then ``fail``).
4. SYSTEM → the worker joins ``crashed_workers``; if the worker was lost (went silent) the
   attempt's on-prem nodes (``attempt_nodes``) join ``failed_nodes``; when ``crashed_workers``
   reaches ``quarantine_after_workers`` → ``quarantine``; else when system failures exceed
   ``failure_budget`` → ``fail``; else ``retry`` with full-jitter backoff.

Both sets only grow; the scheduler keeps the next attempt off their nodes while it can
(docs/scheduler.md, "Placement constraints").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpufleet.lifecycle.billing import Outcome
from gpufleet.lifecycle.classify import Failure
from gpufleet.lifecycle.retry import RetryPolicy, backoff_seconds
from gpufleet.placement import Placement
from gpufleet.status import FailureClass, JobStatus

Action = Literal["retry", "fail", "quarantine", "cancelled", "expired"]


@dataclass(frozen=True)
class Accounting:
    """Retry accounting kept on the job item."""

    system_failures: int = 0
    preemptions: int = 0
    crashed_workers: frozenset[str] = field(default_factory=frozenset)
    #: on-prem nodes of attempts whose worker was lost (all members of a gang: which one went silent is unknown)
    failed_nodes: frozenset[str] = field(default_factory=frozenset)
    #: recorded crashes as ``(fingerprint, worker)``; on the job item as strings ``<fingerprint>|<worker>``
    crashes: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def crash_items(self) -> set[str]:
        return {f"{fp}|{worker}" for fp, worker in self.crashes}

    @staticmethod
    def parse_crashes(items: Any) -> frozenset[tuple[str, str]]:
        out = set()
        for raw in items or ():
            fp, sep, worker = str(raw).partition("|")
            if sep and fp:
                out.add((fp, worker))
        return frozenset(out)


def attempt_nodes(placement: Placement | Mapping[str, Any] | None) -> frozenset[str]:
    """The on-prem nodes of a placement document (its ``node`` and every gang member's); cloud → empty."""
    doc = Placement.parse(placement)
    return doc.nodes if doc else frozenset()


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
            "expired": JobStatus.EXPIRED,
        }.get(self.action)


def decide(
    acc: Accounting, failure: Failure, policy: RetryPolicy, u: float, *, started: bool,
    nodes: frozenset[str] = frozenset(),
) -> Decision:
    """Decide the next step. ``started`` says whether the attempt reached a GPU (for cancel billing);
    ``nodes`` are the failed attempt's on-prem nodes (:func:`attempt_nodes`), recorded when it was lost."""
    if failure.cls is FailureClass.CANCELLED:
        outcome = Outcome.CANCELLED_RUNNING if started else Outcome.CANCELLED_BEFORE_START
        return Decision("cancelled", 0, acc, failure.reason, outcome)
    if failure.cls is FailureClass.EXPIRED:
        return Decision("expired", 0, acc, failure.reason, Outcome.EXPIRED)
    if failure.cls is FailureClass.TIMED_OUT:
        return Decision("fail", 0, acc, failure.reason, Outcome.TIMED_OUT)
    if failure.cls is FailureClass.USER:
        return Decision("fail", 0, acc, failure.reason, Outcome.USER_ERROR)
    if failure.cls is FailureClass.PREEMPTED:
        new = replace(acc, preemptions=acc.preemptions + 1)
        if new.preemptions > policy.max_preemptions:
            return Decision("fail", 0, new, f"preempted {new.preemptions} times", Outcome.PREEMPTED)
        return Decision("retry", int(round(policy.preemption_wait_s)), new, failure.reason, Outcome.PREEMPTED)
    if failure.fingerprint and failure.worker:
        seen_on = sorted(w for fp, w in acc.crashes if fp == failure.fingerprint and w != failure.worker)
        recorded = replace(acc, crashes=acc.crashes | {(failure.fingerprint, failure.worker)})
        if seen_on:
            return Decision(
                "fail", 0, recorded,
                f"deterministic crash: the same failure (fingerprint {failure.fingerprint[:12]}) on {seen_on[0]} "
                f"and {failure.worker}: {failure.reason}", Outcome.USER_ERROR,
            )
        acc = recorded
    crashed = acc.crashed_workers | ({failure.worker} if failure.worker else frozenset())
    failed = acc.failed_nodes | (nodes if failure.lost else frozenset())
    new = Accounting(acc.system_failures + 1, acc.preemptions, frozenset(crashed), frozenset(failed), acc.crashes)
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
