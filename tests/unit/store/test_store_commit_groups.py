"""How the pass's placements are cut into transactions (gpufleet.store.placements.commit_groups): pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.store.placements import MAX_TRANSACTION_ITEMS, commit_groups, shared_counters


@dataclass
class Part:  # the fields of placements._Parts that grouping reads
    n: int
    own: list = field(default_factory=list)
    books: dict = field(default_factory=dict)
    pool: tuple | None = None
    quota: list = field(default_factory=list)


parts = st.lists(st.builds(
    lambda n, own, nodes, pool, team: Part(n, [{}] * own, {f"node-{x}": {0: 1000} for x in nodes},
                                           ("cloud", 1000) if pool else None,
                                           [("acme", "A100", 1000), (f"acme/t{team}", "A100", 1000)]),
    st.integers(), st.integers(3, 6), st.sets(st.integers(0, 30), min_size=0, max_size=4), st.booleans(),
    st.integers(0, 5)), max_size=120)


@given(parts, st.integers(1, 40))
def test_groups_keep_order_and_fit_one_transaction(ps, group):
    groups = commit_groups(ps, group)
    assert [p for g in groups for p in g] == ps
    for g in groups:
        assert 1 <= len(g) <= group
        assert sum(len(p.own) for p in g) + len(shared_counters(g)) <= MAX_TRANSACTION_ITEMS


def test_placements_sharing_counters_pack_densely():
    """Twenty one-GPU placements of one team on five nodes: 4 own items each plus 5 bookings and 2 quota levels
    fit one transaction of 87 items (the old rule, 7 items per placement against half the limit, cut it at 7)."""
    ps = [Part(i, [{}] * 4, {f"node-{i % 5}": {i % 8: 1000}}, None, [("acme", "A100", 1000), ("acme/t1", "A100", 1000)])
          for i in range(20)]
    assert [len(g) for g in commit_groups(ps, 20)] == [20]
