"""User-facing job status, its transition table, and internal attempt state.

Contract:
- ``JobStatus`` is what the API shows. Moves are allowed only along
  ``TRANSITIONS``; terminal statuses have no outgoing edge.
- ``AttemptState`` is the internal state of one placement attempt (one epoch).
  It is kept apart from the job status: a job goes back to PENDING when an
  attempt is preempted, while that attempt ends PREEMPTED.
"""

from __future__ import annotations

from enum import StrEnum

from gpufleet.errors import InvalidTransition


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    REJECTED = "REJECTED"
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    FINALIZING = "FINALIZING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    BLOCKED = "BLOCKED"
    QUARANTINED = "QUARANTINED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"  # the spec's deadline passed before the job started (never placed, not charged)

    def is_terminal(self) -> bool:
        return not TRANSITIONS[self]

    def can_move_to(self, target: JobStatus) -> bool:
        return target in TRANSITIONS[self]


S = JobStatus

#: Allowed moves. PENDING is re-entered when an attempt is retried.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.PENDING, S.REJECTED, S.CANCELLED, S.FAILED, S.EXPIRED}),
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED, S.EXPIRED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.PENDING, S.CANCELLED, S.FAILED, S.QUARANTINED}),
    S.RUNNING: frozenset({S.FINALIZING, S.PENDING, S.CANCELLED, S.FAILED, S.QUARANTINED}),
    S.FINALIZING: frozenset({S.SUCCEEDED, S.BLOCKED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.BLOCKED: frozenset(),
    S.QUARANTINED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
    S.EXPIRED: frozenset(),
}

TERMINAL: frozenset[JobStatus] = frozenset(s for s in JobStatus if s.is_terminal())

#: Statuses that count against the soft "queued jobs" quota at submission.
ACTIVE_QUEUE: frozenset[JobStatus] = frozenset({S.QUEUED, S.PENDING, S.SCHEDULED})


#: Operator recovery moves out of a terminal status (docs/lifecycle.md "Recovery"); never taken by the
#: workflow, only by :mod:`gpufleet.lifecycle.recovery` through :func:`gpufleet.store.jobs.reopen`:
#: release a quarantined job (QUARANTINED → QUEUED, a new workflow run), close one out
#: (QUARANTINED → CANCELLED), and re-finalize a job whose finalize/publish ran out of retries
#: (FAILED → FINALIZING, from the persisted generation).
REOPEN: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUARANTINED: frozenset({S.QUEUED, S.CANCELLED}),
    S.FAILED: frozenset({S.FINALIZING}),
}


def check_reopen(current: JobStatus, target: JobStatus) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> target`` is an operator recovery move."""
    if target not in REOPEN.get(current, frozenset()):
        raise InvalidTransition(
            f"an operator cannot move a job from {current.value} to {target.value}",
            current_status=current.value,
        )


def check_transition(current: JobStatus, target: JobStatus) -> None:
    """Raise :class:`InvalidTransition` unless ``current -> target`` is in the table."""
    if not current.can_move_to(target):
        raise InvalidTransition(
            f"cannot move job from {current.value} to {target.value}",
            current_status=current.value,
        )


def allowed_sources(target: JobStatus) -> list[JobStatus]:
    """Statuses from which ``target`` may be entered (used to build conditional writes)."""
    return [s for s, outs in TRANSITIONS.items() if target in outs]


class AttemptState(StrEnum):
    """Internal state of one attempt (one fencing epoch)."""

    PLACED = "PLACED"
    RUNNING = "RUNNING"
    GENERATED = "GENERATED"  # inference output persisted
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"  # heartbeat timed out; the worker is presumed dead and is fenced
    CANCELLED = "CANCELLED"


class FailureClass(StrEnum):
    """How a failed attempt is classified; drives retry and billing."""

    USER = "USER"
    SYSTEM = "SYSTEM"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"  # the scheduler failed the placement token: the deadline passed before a start
    TIMED_OUT = "TIMED_OUT"  # the attempt ran past the spec's max_run_seconds and was stopped
