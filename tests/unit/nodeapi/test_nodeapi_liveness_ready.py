"""When a heartbeat makes a node usable (:func:`gpufleet.nodeapi.liveness.became_usable`): the first item, the first
after the previous one expired, the first after draining; never while draining, never a node already usable. When it
reports freed capacity (:func:`gpufleet.nodeapi.liveness.freed_capacity`): some GPU freer than the previous report
said, never a draining report, never one that frees nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.clock import iso
from gpufleet.nodeapi.liveness import FREED_WAKE_MIN_INTERVAL_S, became_usable, freed_capacity

NOW = 1_700_000_000.0


def item(expires_at: float, draining: bool = False) -> dict:
    return {"node_id": "n1", "expires_at": expires_at, "draining": draining}


def test_the_transitions_into_usable():
    assert became_usable(None, item(NOW + 60), NOW)
    assert became_usable(item(NOW - 1), item(NOW + 60), NOW)  # expired
    assert became_usable(item(NOW), item(NOW + 60), NOW)  # expiring now: the scheduler no longer counts it
    assert became_usable(item(NOW + 30, draining=True), item(NOW + 60), NOW)
    assert not became_usable(item(NOW + 30), item(NOW + 60), NOW)


@given(previous=st.none() | st.builds(item, st.floats(NOW - 1e4, NOW + 1e4), st.booleans()),
       expires=st.floats(NOW, NOW + 1e4))
def test_a_draining_report_never_wakes_the_scheduler(previous, expires):
    assert not became_usable(previous, item(expires, draining=True), NOW)


def gpus(*free: int, draining: bool = False, at: float = NOW - 2) -> dict:
    return {"node_id": "n1", "draining": draining, "heartbeat_at": iso(at),
            "gpus": [{"index": i, "milli_free": m} for i, m in enumerate(free)]}


def test_a_gpu_freer_than_before_is_freed_capacity():
    assert freed_capacity(gpus(0, 1000), gpus(1000, 1000), NOW)  # the job on GPU 0 ended
    assert freed_capacity(gpus(250, 0), gpus(500, 0), NOW)  # a shared GPU's share came back
    assert freed_capacity(gpus(0, 1000), gpus(1000, 0), NOW)  # one ended, another started: GPU 0 is free now
    assert not freed_capacity(gpus(1000, 1000), gpus(1000, 1000), NOW)  # nothing changed
    assert not freed_capacity(gpus(1000, 1000), gpus(0, 1000), NOW)  # a job started
    assert not freed_capacity(None, gpus(1000), NOW)  # a first item: became_usable's case
    assert not freed_capacity(gpus(0), gpus(1000, draining=True), NOW)  # draining: nothing to place there
    # a node flipping its report faster than once a second wakes nobody (its release at CompleteRun still does)
    assert not freed_capacity(gpus(0, at=NOW - 0.5), gpus(1000), NOW)
    assert freed_capacity(gpus(0, at=NOW - FREED_WAKE_MIN_INTERVAL_S), gpus(1000), NOW)


# quarter seconds: exact in binary, so the item's millisecond timestamp says exactly when the previous beat was
@given(before=st.lists(st.integers(0, 1000), min_size=1, max_size=8), since=st.integers(0, 120).map(lambda q: q / 4),
       data=st.data())
def test_freed_capacity_is_some_gpu_freer_at_most_once_a_second(before, since, data):
    after = data.draw(st.lists(st.integers(0, 1000), min_size=len(before), max_size=len(before)))
    previous = gpus(*before, at=NOW - since)
    freer = any(a > b for a, b in zip(after, before, strict=True))
    assert freed_capacity(previous, gpus(*after), NOW) == (freer and since >= FREED_WAKE_MIN_INTERVAL_S)
    assert not freed_capacity(previous, gpus(*after, draining=True), NOW)
