"""The gang verdict (:mod:`gpufleet.nodeapi.gangstate`): the barrier opens only when every member is ready, so no
member starts while another has not arrived; past the barrier timeout a closed barrier fails the whole gang;
once started, a silent running member fails it; a failed gang stays failed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.nodeapi.gangstate import DISPATCHED, READY, SUCCEEDED, GangState, verdict

T0, SILENCE, BARRIER = 1_000.0, 30.0, 60.0


def _attempt(nodes: list[str], states: dict, beats: dict, failed=None) -> dict:
    return {"placement": {"node": nodes[0], "queue_url": "q", "members": [{"node": n, "queue_url": f"q/{n}"} for n in nodes]},
            "gang": states, "gang_beats": beats, "dispatched_at": T0, **({"gang_failed": failed} if failed else {})}


members = st.integers(2, 6).map(lambda n: [f"n{i}" for i in range(n)])


@settings(deadline=None, max_examples=200)
@given(nodes=members, data=st.data(), now=st.floats(T0, T0 + 500))
def test_never_partially_started_and_a_closed_barrier_times_out(nodes, data, now):
    states = {n: data.draw(st.sampled_from([DISPATCHED, READY, SUCCEEDED])) for n in nodes}
    beats = {n: data.draw(st.floats(T0, now)) for n in nodes if states[n] != DISPATCHED}
    g = GangState.of(_attempt(nodes, states, beats))
    assert g.released == all(s != DISPATCHED for s in states.values())  # the barrier opens only for all
    v = verdict(g, now, silence_s=SILENCE, barrier_timeout_s=BARRIER)
    if not g.released:
        assert (v is not None) == (now - T0 > BARRIER)  # held until the timeout, then the whole gang fails
        assert v is None or "barrier" in v
    else:
        silent = [n for n in nodes if states[n] == READY and now - beats[n] > SILENCE]
        assert (v is not None) == bool(silent)


def test_a_single_node_attempt_has_no_gang_and_a_failed_gang_stays_failed():
    assert GangState.of({"placement": {"node": "n0", "queue_url": "q"}}) is None
    g = GangState.of(_attempt(["a", "b"], {"a": READY, "b": READY}, {"a": T0, "b": T0}, {"node": "b", "reason": "x"}))
    assert verdict(g, T0, silence_s=SILENCE, barrier_timeout_s=BARRIER) == "x"
    assert g.rank("b") == 1
