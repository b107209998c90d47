"""GPU slot accounting: whole and fractional GPUs, placement-named indices, never over capacity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import BadRequest
from onprem_agent.slots import MILLI, GpuSlots, Request


def test_whole_gpus_and_named_indices():
    s = GpuSlots([0, 1, 2, 3])
    assert s.acquire("a", Request(milli=2000)) == [0, 1]
    assert s.acquire("b", Request(indices=(1,), milli=1000)) is None  # busy: wait
    assert s.acquire("b", Request(indices=(3,), milli=1000)) == [3]
    assert s.acquire("a", Request(milli=2000)) == [0, 1]  # idempotent per holder
    assert s.whole_free() == 1
    assert s.release("a") == [0, 1]
    assert s.release("a") == []
    assert s.whole_free() == 3


def test_fractional_requests_share_a_gpu_best_fit():
    s = GpuSlots([0, 1])
    assert s.acquire("x", Request(milli=500)) == [0]
    assert s.acquire("y", Request(milli=300)) == [0]  # best fit: the fuller device that still fits
    assert s.acquire("z", Request(milli=1000)) == [1]  # a whole GPU is still available
    assert s.acquire("w", Request(milli=300)) is None
    assert s.free_milli() == {0: 200, 1: 0}


@pytest.mark.parametrize(
    "req",
    [Request(indices=(7,)), Request(milli=3000), Request(indices=(0,), milli=2000), Request(milli=0)],
)
def test_requests_this_node_can_never_satisfy(req):
    with pytest.raises(BadRequest):
        GpuSlots([0, 1]).acquire("a", req)


ops = st.lists(
    st.tuples(
        st.sampled_from(["acq", "rel"]),
        st.integers(0, 5),  # holder
        st.sampled_from([250, 500, 1000, 2000]),
        st.booleans(),  # name indices?
        st.integers(0, 2),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_holds_never_exceed_capacity_and_release_restores(seq):
    s = GpuSlots([0, 1, 2])
    held: dict[str, tuple[list[int], int]] = {}
    for op, h, milli, named, first in seq:
        holder = f"h{h}"
        if op == "acq":
            n = max(1, milli // MILLI)
            idx = tuple(range(first, first + n)) if named and first + n <= 3 else ()
            got = s.acquire(holder, Request(indices=idx, milli=milli))
            if got is not None and holder not in held:
                held[holder] = (got, min(milli, MILLI))
                assert len(got) == n
                if idx:
                    assert got == list(idx)
        else:
            s.release(holder)
            held.pop(holder, None)
        used = {i: 0 for i in range(3)}
        for gpus, per in held.values():
            for i in gpus:
                used[i] += per
        assert all(0 <= s.free_milli()[i] == MILLI - used[i] for i in range(3))
    for holder in list(held):
        s.release(holder)
    assert s.free_milli() == {0: MILLI, 1: MILLI, 2: MILLI}


def test_unnamed_multi_gpu_requests_take_the_best_linked_free_set():
    from itertools import combinations

    from gpufleet.topology import Topology

    islands = Topology.of(range(8), {(a, b): "nvlink" if a // 4 == b // 4 else "system"
                                     for a, b in combinations(range(8), 2)})
    s = GpuSlots(list(range(8)), islands)
    assert s.acquire("one", Request(milli=1000)) == [0]
    assert s.acquire("four", Request(milli=4000)) == [4, 5, 6, 7]  # 0 busy: 1,2,3,4 would cross the islands
    assert s.acquire("two", Request(milli=2000)) == [1, 2]
    assert GpuSlots([0, 1, 2, 3]).acquire("x", Request(milli=2000)) == [0, 1]  # unknown topology: lowest indices
