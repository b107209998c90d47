"""When a heartbeat makes a node usable (:func:`gpufleet.nodeapi.liveness.became_usable`): the first item, the first
after the previous one expired, the first after draining; never while draining, never a node already usable."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.nodeapi.liveness import became_usable

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
