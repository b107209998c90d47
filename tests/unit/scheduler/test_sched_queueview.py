"""The queue view of a pass: positions in pass order, then backing-off jobs; estimated starts from the pass's rate."""

from __future__ import annotations

from dataclasses import dataclass

from sched_strategies import POOLS
from test_sched_pass_report import Stores, job, node

from gpufleet.clock import FakeClock
from gpufleet.scheduler import queueview
from gpufleet.scheduler.model import Snapshot
from gpufleet.scheduler.passes import PassStores, run_pass


def test_positions_follow_the_pass_order_and_backoffs_come_last():
    jobs = [job("a"), job("b"), job("c"), job("late", backoff_until=500.0), job("sooner", backoff_until=300.0)]
    view = queueview.build(jobs, ["a", "b", "c"], {"a"}, 100.0, pass_interval_s=60.0)
    assert {k: v[0] for k, v in view.jobs.items()} == {"b": 1, "c": 2, "sooner": 3, "late": 4}
    assert view.jobs["b"][1] == 160.0 and view.jobs["c"][1] == 220.0  # one placed a pass: one pass each
    assert view.jobs["late"][1] == 500.0  # never before its backoff ends
    assert view.pending == 4 and view.of("a") is None and view.of("b")["position"] == 1
    nothing = queueview.build(jobs, ["a"], set(), 100.0, pass_interval_s=60.0)
    assert nothing.jobs["a"] == (1, None)  # the pass placed nothing: no rate, no estimate


@dataclass
class WithQueue(Stores):
    view: queueview.QueueView | None = None

    def put(self, view):
        self.view = view

    def get(self):
        return self.view


def test_the_pass_writes_its_view():
    stores = WithQueue(Snapshot(now=100.0, jobs=(job("fits"), job("no-room", num_gpu=3)), pools=POOLS,
                                nodes=(node("n1", (1000, 1000, 0, 0)),)))
    run_pass(PassStores(stores, stores, stores, queue=stores), pools=POOLS, clock=FakeClock(100.0),
             pass_interval_s=30.0)
    assert stores.view.jobs == {"no-room": (1, 130.0)}
