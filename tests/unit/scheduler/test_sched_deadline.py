"""A job whose deadline passed before it ever started is expired by the pass, never placed (pure, fake stores)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sched_strategies import POOLS
from test_sched_pass_report import Stores, job, node

from gpufleet.clock import FakeClock
from gpufleet.lifecycle.billing import BillingPolicy, Outcome, charge_for
from gpufleet.lifecycle.classify import classify
from gpufleet.lifecycle.decide import Accounting, decide
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.scheduler.model import Snapshot
from gpufleet.scheduler.passes import PassStores, run_pass
from gpufleet.status import FailureClass, JobStatus


@dataclass
class Expiring(Stores):
    expired: list[tuple[str, str | None]] = field(default_factory=list)

    def expire(self, job_id, token, reason):
        self.expired.append((job_id, token))
        return True


def test_late_jobs_that_never_started_expire_and_are_not_placed():
    clock = FakeClock(100.0)
    jobs = (job("late", deadline=99.0, placement_token="tok-late"), job("on-time", deadline=500.0),
            job("retrying", deadline=50.0, attempts=1), job("no-deadline"))
    stores = Expiring(Snapshot(now=100.0, jobs=jobs, pools=POOLS, nodes=(node("n1", (1000,) * 8),)))
    report = run_pass(PassStores(stores, stores, stores), pools=POOLS, clock=clock)
    assert stores.expired == [("late", "tok-late")] and report.expired == 1
    assert sorted(stores.committed) == ["no-deadline", "on-time", "retrying"]  # a started job is not expired


def test_an_expired_token_failure_ends_the_job_expired_and_uncharged():
    failure = classify({"Error": "EXPIRED", "Cause": '{"detail": "the deadline passed"}'}, None, cancel_requested=False)
    assert failure.cls is FailureClass.EXPIRED
    d = decide(Accounting(), failure, RetryPolicy(), 0.5, started=False)
    assert d.terminal_status is JobStatus.EXPIRED and d.outcome is Outcome.EXPIRED
    assert charge_for(Outcome.EXPIRED, 0.0, 3.6, BillingPolicy()).charged is False
    cancelled = classify({"Error": "EXPIRED"}, None, cancel_requested=True)  # a cancel wins
    assert cancelled.cls is FailureClass.CANCELLED
    assert JobStatus.EXPIRED.is_terminal() and JobStatus.PENDING.can_move_to(JobStatus.EXPIRED)
