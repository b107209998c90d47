"""GPU-time attribution (gpufleet.diagnose.attribution): each GPU's causes partition the window exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.diagnose.attribution import (
    Booking,
    Cause,
    Inputs,
    NodeInventory,
    PendingInterval,
    attribute,
)
from gpufleet.phases import MARKS

T0 = 1_000_000.0


def test_one_attempt_phase_by_phase():
    marks = {"placed": T0, "dispatched": T0 + 1, "started": T0 + 3, "inputs_staged": T0 + 6, "model_loaded": T0 + 16,
             "first_step": T0 + 17, "generation_done": T0 + 27, "model_cache": "miss"}
    b = Booking.with_marks(marks, job_id="j1", epoch=1, node_id="n1", gpus=(0,), start=T0, end=T0 + 29)
    res = attribute(Inputs(T0, T0 + 40, (NodeInventory("n1", "p", 2),), (b,)))
    s = {c: ms / 1000 for c, ms in res.totals_ms.items() if ms}
    assert s == {Cause.HELD_IDLE: 1, Cause.STARTING: 2, Cause.STAGING: 3, Cause.MODEL_LOAD: 10,
                 Cause.COMPUTING: 11, Cause.POST_PROCESSING: 2, Cause.FREE_NO_WORK: 40 + 11}
    table = res.table()
    assert [r.cause for r in table[:2]] == [Cause.MODEL_LOAD, Cause.STAGING]  # lost causes first, largest first
    assert table[-1].cause in (Cause.COMPUTING, Cause.FREE_NO_WORK) and not table[-1].lost
    assert res.utilisation == 11 / 80


def test_free_gpus_while_the_queue_waits_are_split_by_why():
    nodes = (NodeInventory("a", "p", 2), NodeInventory("b", "p", 2), NodeInventory("c", "q", 1),
             NodeInventory("d", "p", 1, drained=True))
    busy = (Booking("x", 1, "a", (0,), T0, None), Booking("y", 1, "b", (0,), T0, None))
    # 0-10: a 2-GPU job: 2 GPUs free in p but on two nodes -> fragmentation; pool q: not allowed -> affinity
    # 10-20: a quota-blocked head; 20-30: a 1-GPU job that fits (latency); 30-40: a 4-GPU job (head of line)
    pend = (PendingInterval("f", T0, T0 + 10, 2, ("p",), "no room"),
            PendingInterval("q", T0 + 10, T0 + 20, 1, ("p",), "quota of t1 for L4 would be exceeded"),
            PendingInterval("l", T0 + 20, T0 + 30, 1, ("p",)),
            PendingInterval("h", T0 + 30, T0 + 40, 4, ("p",), "no room"))
    res = attribute(Inputs(T0, T0 + 50, nodes, busy, pend))
    by = {(ln.node_id, ln.gpu): [(s.seconds, s.cause) for s in ln.segments] for ln in res.lanes}
    assert by[("a", 1)] == [(10, Cause.FREE_FRAGMENTATION), (10, Cause.FREE_QUOTA), (10, Cause.FREE_SCHED_LATENCY),
                            (10, Cause.FREE_HEAD_OF_LINE), (10, Cause.FREE_NO_WORK)]
    assert by[("c", 0)][0] == (40, Cause.FREE_AFFINITY)
    assert by[("d", 0)] == [(50, Cause.DRAINED)]
    assert by[("a", 0)] == [(50, Cause.UNREPORTED)]  # running, no marks reported yet


def test_a_checkpoint_stall_is_taken_from_computing():
    b = Booking.with_marks({"started": T0, "model_loaded": T0 + 1, "generation_done": T0 + 11}, job_id="j", epoch=1,
                           node_id="n", gpus=(0,), start=T0, end=T0 + 11, stalls=((T0 + 4, T0 + 6),))
    res = attribute(Inputs(T0, T0 + 11, (NodeInventory("n", "p", 1),), (b,)))
    assert res.totals_ms[Cause.CHECKPOINT] == 2000 and res.totals_ms[Cause.COMPUTING] == 8000


times = st.floats(min_value=T0 - 50, max_value=T0 + 150, allow_nan=False)


@st.composite
def inputs(draw):
    nodes = tuple(NodeInventory(f"n{i}", draw(st.sampled_from(["p", "q"])), draw(st.integers(0, 3)),
                                draw(st.booleans())) for i in range(draw(st.integers(1, 3))))
    bookings = []
    for j in range(draw(st.integers(0, 6))):
        n = draw(st.sampled_from(nodes))
        start = draw(times)
        end = draw(st.none() | st.floats(min_value=start, max_value=T0 + 200))
        marks = {m: draw(times) for m in draw(st.lists(st.sampled_from(
            ["dispatched", "started", "inputs_staged", "model_loaded", "first_step", "generation_done"]), unique=True))}
        marks = dict(zip(sorted(marks, key=MARKS.index), sorted(marks.values()), strict=True))  # phase marks never go back in time
        stalls = tuple((a, a + draw(st.floats(0, 20))) for a in draw(st.lists(times, max_size=2)))
        bookings.append(Booking.with_marks(marks, job_id=f"j{j}", epoch=1, node_id=n.node_id,
                                           gpus=tuple(draw(st.sets(st.integers(0, 4)))), start=start, end=end,
                                           stalls=stalls))
    pending = tuple(PendingInterval(f"w{i}", s, draw(st.none() | st.floats(min_value=s, max_value=T0 + 200)),
                                    draw(st.integers(1, 8)), tuple(draw(st.sets(st.sampled_from(["p", "q"])))),
                                    draw(st.sampled_from(["", "no room", "quota of x", "blocked behind a starving job",
                                                          "pool p has L4, job wants A100"])))
                    for i, s in enumerate(draw(st.lists(times, max_size=4))))
    start = draw(times)
    return Inputs(start, start + draw(st.floats(min_value=0.01, max_value=100)), nodes, tuple(bookings), pending)


@settings(max_examples=50, deadline=None)
@given(inputs())
def test_each_gpu_is_partitioned_exactly(inp):
    res = attribute(inp)
    window_ms = round(inp.end * 1000) - round(inp.start * 1000)
    assert len(res.lanes) == sum(n.gpus for n in inp.nodes)
    for lane in res.lanes:
        assert sum(s.end_ms - s.start_ms for s in lane.segments) == window_ms
        assert all(s.end_ms > s.start_ms for s in lane.segments)  # no negative or empty piece
        for prev, nxt in zip(lane.segments, lane.segments[1:], strict=False):
            assert prev.end_ms == nxt.start_ms  # no gap, no overlap: no double counting
        assert lane.segments[0].start_ms == round(inp.start * 1000)
    assert sum(res.totals_ms.values()) == window_ms * len(res.lanes)
    assert all(v >= 0 for v in res.totals_ms.values())
    assert sum(sum(p.values()) for p in res.by_pool_ms.values()) == sum(res.totals_ms.values())
    assert sum(sum(n.values()) for n in res.by_node_ms().values()) == sum(res.totals_ms.values())
    rows = res.table()  # the lost causes first, each group largest first
    lost = [r.gpu_seconds for r in rows if r.lost]
    assert [r.lost for r in rows] == sorted((r.lost for r in rows), reverse=True) and lost == sorted(lost, reverse=True)
    drained = {n.node_id for n in inp.nodes if n.drained}
    for lane in res.lanes:  # a drained node's GPU is never given a free-queue cause
        if lane.node_id in drained:
            assert not any(s.cause.value.startswith("free_") for s in lane.segments)


def test_the_runtimes_stall_total_and_busy_share_split_the_steps():
    """``checkpoint_stall`` (seconds, recorded by the runtime) goes to CHECKPOINT; of the computing rest, the
    measured ``gpu_busy`` share is computing and the remainder held but idle; unmeasured: all computing."""
    marks = {"started": T0, "model_loaded": T0 + 2, "first_step": T0 + 3, "generation_done": T0 + 13,
             "checkpoint_stall": 2.0, "gpu_busy": 0.75}
    inv = (NodeInventory("n1", "p", 1),)
    b = Booking.with_marks(marks, job_id="j", epoch=1, node_id="n1", gpus=(0,), start=T0, end=T0 + 13)
    assert b.stalls == ((T0 + 11, T0 + 13),) and b.busy == 0.75
    s = {c: ms / 1000 for c, ms in attribute(Inputs(T0, T0 + 13, inv, (b,))).totals_ms.items() if ms}
    # computing: first-step warm-up 1 s + steps 10 s - stall 2 s = 9 s, of which 75 % busy
    assert s == {Cause.MODEL_LOAD: 2, Cause.CHECKPOINT: 2, Cause.COMPUTING: 6.75, Cause.HELD_IDLE: 2.25}
    unmeasured = Booking.with_marks({k: v for k, v in marks.items() if k != "gpu_busy"}, job_id="j", epoch=1,
                                    node_id="n1", gpus=(0,), start=T0, end=T0 + 13)
    s = {c: ms / 1000 for c, ms in attribute(Inputs(T0, T0 + 13, inv, (unmeasured,))).totals_ms.items() if ms}
    assert s == {Cause.MODEL_LOAD: 2, Cause.CHECKPOINT: 2, Cause.COMPUTING: 9}
    # a stall longer than the steps stops at the first step
    long = Booking.with_marks(marks | {"checkpoint_stall": 50.0}, job_id="j", epoch=1, node_id="n1", gpus=(0,),
                              start=T0, end=T0 + 13)
    assert long.stalls == ((T0 + 3, T0 + 13),)
