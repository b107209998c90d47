"""Recording the nodes an attempt failed on (pure): ``attempt_nodes`` and ``failed_nodes`` in ``decide``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.lifecycle.classify import Failure, classify
from gpufleet.lifecycle.decide import Accounting, attempt_nodes, decide
from gpufleet.lifecycle.retry import RetryPolicy
from gpufleet.status import FailureClass

POLICY = RetryPolicy(base_s=2, cap_s=60, failure_budget=5, quarantine_after_workers=4, max_preemptions=5)
GANG = {"epoch": 3, "node": "n1", "pool": "onprem-a",
        "members": [{"node": "n1", "gpu_indices": [0]}, {"node": "n2", "gpu_indices": [0]}]}


def test_attempt_nodes_of_single_gang_and_cloud_placements():
    assert attempt_nodes({"epoch": 1, "node": "n7", "pool": "onprem-a"}) == {"n7"}
    assert attempt_nodes(GANG) == {"n1", "n2"}
    assert attempt_nodes({"epoch": 1, "node": None, "pool": "cloud-spot", "members": [{"node": None}]}) == frozenset()
    assert attempt_nodes(None) == frozenset() and attempt_nodes({}) == frozenset()


def test_lost_worker_records_every_node_of_the_attempt():
    lost = classify({"Error": "States.HeartbeatTimeout"}, GANG, cancel_requested=False)
    assert lost.lost and lost.worker == "n1"
    d = decide(Accounting(), lost, POLICY, 0.5, started=True, nodes=attempt_nodes(GANG))
    assert d.action == "retry" and d.accounting.failed_nodes == {"n1", "n2"}
    assert d.accounting.crashed_workers == {"n1"}  # quarantine still counts one worker per failure


def test_crash_that_is_not_lost_leaves_failed_nodes_alone():
    crash = classify({"Error": "SYSTEM_ERROR", "Cause": '{"node": "n2", "detail": "oom"}'}, GANG, cancel_requested=False)
    d = decide(Accounting(failed_nodes=frozenset({"n9"})), crash, POLICY, 0.5, started=True, nodes=attempt_nodes(GANG))
    assert d.accounting.failed_nodes == {"n9"} and d.accounting.crashed_workers == {"n2"}


def test_cancel_user_and_preemption_record_no_failed_node():
    acc = Accounting(failed_nodes=frozenset({"n9"}))
    for failure in (
        classify({"Error": "States.Timeout"}, GANG, cancel_requested=True),  # lost, but the user cancelled
        Failure(FailureClass.USER, "bad args", "n1", True),
        Failure(FailureClass.PREEMPTED, "spot", "n1", True),
    ):
        d = decide(acc, failure, POLICY, 0.5, started=True, nodes=frozenset({"n1", "n2"}))
        assert d.accounting.failed_nodes == {"n9"}


failures = st.builds(
    Failure,
    st.sampled_from(list(FailureClass)),
    st.just("x"),
    st.sampled_from([None, "n1", "n2"]),
    st.booleans(),
)


@given(st.lists(st.tuples(failures, st.frozensets(st.sampled_from(["n1", "n2", "n3"]))), min_size=1, max_size=8),
       st.floats(0, 1, exclude_max=True))
def test_failed_nodes_grow_exactly_by_lost_system_attempts(steps, u):
    acc = Accounting()
    for failure, nodes in steps:
        d = decide(acc, failure, POLICY, u, started=True, nodes=nodes)
        lost_system = failure.cls is FailureClass.SYSTEM and failure.lost
        assert d.accounting.failed_nodes == acc.failed_nodes | (nodes if lost_system else frozenset())
        assert d.accounting.crashed_workers >= acc.crashed_workers
        if d.action != "retry":
            break
        acc = d.accounting
