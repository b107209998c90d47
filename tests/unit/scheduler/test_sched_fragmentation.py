"""Fragmentation measure (FGD definition) against a direct reference, and the packing policies' basics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.errors import ConfigError
from gpufleet.scheduler import registry
from gpufleet.scheduler.fragmentation import TaskMix, frag_of, share_after, whole_after
from gpufleet.scheduler.nodetable import NodeTable, Request

MIX = TaskMix.from_requests(
    [Request(4000, 0, 1, 500)] * 5
    + [Request(12000, 0, 1, 1000)] * 4
    + [Request(24000, 0, 2, 1000)] * 2
    + [Request(2000, 0, 0, 0)] * 2
    + [Request(8000, 0, 1, 250, frozenset({"T4"}))] * 2,
    coverage=1.0,
)
MODELS = ["A100", "T4"]


def reference(cpu: int, gpus: list[int], model: str) -> float:
    total = sum(gpus)
    out = 0.0
    for t in range(len(MIX.p)):
        m, k, c, types = MIX.milli[t], MIX.num_gpu[t], MIX.cpu[t], MIX.types[t]
        if m == 0 or (types and model not in types):
            out += MIX.p[t] * total
            continue
        if sum(1 for g in gpus if g >= m) >= k and cpu >= c:
            out += MIX.p[t] * sum(g for g in gpus if g < m)
        else:
            out += MIX.p[t] * total
    return out


state = st.tuples(
    st.integers(0, 64000),
    st.lists(st.sampled_from([0, 100, 250, 500, 750, 1000]), min_size=1, max_size=8),
    st.sampled_from([0, 1]),
)


@settings(max_examples=150, deadline=None)
@given(state, st.sampled_from([100, 250, 500, 800]))
def test_frag_and_share_deltas_match_the_definition(s, milli):
    cpu, gpus, model = s
    row = sorted(gpus, reverse=True) + [0] * (8 - len(gpus))
    acc = MIX.access(MODELS)
    got = frag_of(np.array([cpu]), np.array([row]), np.array([model]), MIX, acc)[0]
    assert got == pytest.approx(reference(cpu, row, MODELS[model]))
    req = Request(1000, 0, 1, milli)
    after = share_after(np.array([cpu]), np.array([row]), np.array([model]), req, MIX, acc)[0]
    for g in range(8):
        if row[g] >= milli:
            new = list(row)
            new[g] -= milli
            assert after[g] == pytest.approx(reference(cpu - 1000, new, MODELS[model]))
        else:
            assert after[g] == np.inf


def test_whole_gpu_requests_take_the_tightest_fitting_gpus():
    rows = np.array([[1000, 1000, 1000, 500, 0, 0, 0, 0]])
    out = whole_after(None, None, rows, None, Request(0, 0, 2, 1000))
    assert out.tolist() == [[1000, 0, 0, 500, 0, 0, 0, 0]]


def _table():
    return NodeTable(["a", "b", "c"], ["A100", "A100", "T4"], [32000, 32000, 32000], [10**6] * 3, [4, 8, 2])


@pytest.mark.parametrize("name", registry.names("packing"))
def test_every_policy_respects_type_capacity_and_returns_none_when_full(name):
    t = _table()
    pol = registry.build("packing", name)
    rng = np.random.default_rng(0)
    # a T4-only share lands on the T4 node
    c = pol.choose(t, Request(1000, 0, 1, 300, frozenset({"T4"})), rng, MIX)
    assert t.node_ids[c.node] == "c"
    # 8 whole GPUs only fit on b
    c = pol.choose(t, Request(1000, 0, 8, 1000), rng, MIX)
    assert t.node_ids[c.node] == "b" and len(c.gpus) == 8
    t.allocate(c.node, c.gpus, Request(1000, 0, 8, 1000))
    assert pol.choose(t, Request(1000, 0, 8, 1000), rng, MIX) is None
    with pytest.raises(ValueError):
        t.allocate(c.node, c.gpus, Request(0, 0, 8, 1000))  # double booking is refused


def test_frag_aware_keeps_a_share_on_an_already_shared_gpu():
    t = _table()
    t.allocate(0, (1,), Request(1000, 0, 1, 500))
    c = registry.build("packing", "frag-aware").choose(t, Request(1000, 0, 1, 500), np.random.default_rng(0), MIX)
    assert (t.node_ids[c.node], c.gpus) == ("a", (1,))


def test_unknown_policy_is_rejected():
    with pytest.raises(ConfigError):
        registry.build("packing", "worst-fit")


@pytest.mark.parametrize("name", ["dot-product", "packing", "best-fit", "fgd"])
def test_lowest_ties_go_to_the_first_node_and_random_ties_spread(name):
    def same():
        return NodeTable(["a", "b", "c", "d"], ["A100"] * 4, [32000] * 4, [10**6] * 4, [4] * 4)

    req = Request(1000, 0, 0, 0)  # CPU-only: every node scores the same under these policies
    lowest = registry.build("packing", name, ties="lowest")
    assert {lowest.choose(same(), req, np.random.default_rng(s), MIX).node for s in range(8)} == {0}
    rand = registry.build("packing", name)
    assert len({rand.choose(same(), req, np.random.default_rng(s), MIX).node for s in range(8)}) > 1
    with pytest.raises(ValueError):
        registry.build("packing", name, ties="highest")


def test_frag_aware_near_ties_go_to_the_lowest_index_or_the_tightest_fit():
    # a (4 GPUs) and b (2 GPUs) are both empty; a whole-GPU pod grows fragmentation by the same on both
    t = NodeTable(["a", "b"], ["A100", "A100"], [32000, 32000], [10**6] * 2, [4, 2])
    req = Request(4000, 0, 1, 1000)
    mix = TaskMix.from_requests([req], coverage=1.0)
    rng = np.random.default_rng(0)
    assert registry.build("packing", "frag-aware", cpu_weight=0.0).choose(t, req, rng, mix).node == 0
    tight = registry.build("packing", "frag-aware", cpu_weight=0.0, ties="tightest")
    assert tight.choose(t, req, rng, mix).node == 1
    with pytest.raises(ValueError):
        registry.build("packing", "frag-aware", ties="random")
