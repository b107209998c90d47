"""GPU choice within a node from its NVML topology (gpufleet.topology): properties and a DGX-like fixture."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.topology import CODES, LEVELS, Topology, choose, link_of


def dgx_like() -> Topology:
    """8 GPUs in two NVLink islands (0-3, 4-7); inside a socket a PCIe switch per pair, across sockets SYSTEM."""

    def level(a: int, b: int) -> str:
        if a // 4 == b // 4:
            return "nvlink"
        return "system"

    return Topology.of(range(8), {(a, b): level(a, b) for a, b in combinations(range(8), 2)})


def pcie_box() -> Topology:
    """4 GPUs without NVLink: 0-1 and 2-3 share a PCIe switch, the pairs meet at the host bridge."""
    return Topology.of(
        range(4), {(a, b): "pcie-switch" if a // 2 == b // 2 else "host-bridge" for a, b in combinations(range(4), 2)}
    )


def test_the_code_is_one_letter_per_pair_and_parses_back():
    t = dgx_like()
    code = t.code()
    assert len(code) == 28 and set(code) == {"N", "X"} and code.startswith("NNNXXXX")
    assert Topology.parse(range(8), code) == t
    assert Topology.parse(range(7), code) is None  # the wrong length for the GPUs: unknown, not guessed
    assert Topology.parse(range(8), code[:-1] + "?") is None
    assert Topology.parse([0], "") is None


def test_dgx_like_choices_stay_inside_an_nvlink_island():
    t = dgx_like()
    assert choose(range(8), 4, t) == (0, 1, 2, 3)
    # GPUs 0 and 5 busy: both islands have three left; the lower island wins the tie
    assert choose([1, 2, 3, 4, 6, 7], 3, t) == (1, 2, 3)
    assert choose([0, 4, 5, 6, 7], 4, t) == (4, 5, 6, 7)
    assert link_of((4, 5, 6, 7), t) == "nvlink" and link_of((3, 4), t) == "system"
    # two free in each island: a pair that shares NVLink, not the lowest indices (0 and 4 would cross sockets)
    assert choose([0, 4, 5], 2, t) == (4, 5)
    assert choose([0, 1, 2, 3], 2, pcie_box()) == (0, 1) and choose([1, 2, 3], 2, pcie_box()) == (2, 3)
    assert link_of((1, 2), pcie_box()) == "host-bridge"


def test_without_topology_the_lowest_free_indices_and_unknown():
    assert choose([5, 2, 7, 3], 2, None) == (2, 3)
    assert link_of((2, 3), None) == "unknown" and link_of((2,), None) == ""
    # a topology that does not cover every free GPU is not used either
    assert choose([0, 1, 9], 2, pcie_box()) == (0, 1) and link_of((0, 9), pcie_box()) == "unknown"


@st.composite
def cases(draw):
    n_gpus = draw(st.integers(2, 8))
    pairs = list(combinations(range(n_gpus), 2))
    code = "".join(draw(st.lists(st.sampled_from(CODES), min_size=len(pairs), max_size=len(pairs))))
    topo = Topology.parse(range(n_gpus), code)
    free = draw(st.sets(st.integers(0, n_gpus - 1), min_size=1))
    n = draw(st.integers(1, len(free)))
    return topo, sorted(free), n


@settings(max_examples=150, deadline=None)
@given(cases())
def test_choose_returns_exactly_n_free_gpus_and_the_best_worst_link(case):
    topo, free, n = case
    got = choose(free, n, topo)
    assert len(got) == n == len(set(got)) and set(got) <= set(free)  # never a busy GPU, exactly n
    if n >= 2:
        best = min(max(LEVELS.index(topo.level(a, b)) for a, b in combinations(c, 2)) for c in combinations(free, n))
        assert LEVELS.index(link_of(got, topo)) == best
        full_nvlink = any(
            all(topo.level(a, b) == "nvlink" for a, b in combinations(c, 2)) for c in combinations(free, n)
        )
        assert (link_of(got, topo) == "nvlink") == full_nvlink  # a full-NVLink set whenever one exists
    assert choose(free, n, None) == tuple(free[:n])


def test_greedy_beyond_the_exhaustive_bound_still_returns_n_free_gpus():
    t = Topology.of(
        range(24), {(a, b): "nvlink" if a % 2 == b % 2 else "pcie-switch" for a, b in combinations(range(24), 2)}
    )
    got = choose(range(24), 12, t)  # C(24, 12) = 2.7M sets: greedy
    assert len(got) == 12 and link_of(got, t) == "nvlink"
