"""Batching's pure parts: the compatibility key, grouping waiting jobs, the batch's capacity and the GPU-time split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet import batching
from gpufleet.spec import JobSpec


def _spec(**w) -> JobSpec:
    return JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "a red fox", **w}})


def test_key_ignores_prompt_seed_and_negative_prompt_and_separates_everything_the_loop_shares():
    base = _spec()
    assert batching.batch_key(base) == batching.batch_key(_spec(prompt="a cat", seed=9, negative_prompt="blur"))
    for change in (
        {"steps": 4},
        {"frames": 5},
        {"width": 128},
        {"height": 128},
        {"guidance": 1.0},
        {"model": "other-model"},
    ):
        assert batching.batch_key(_spec(**change)) != batching.batch_key(base), change
    container = JobSpec.model_validate(
        {"workload": {"kind": "container", "image": "localhost/x:1", "command": ["true"]}}
    )
    assert batching.batch_key(container) is None
    assert batching.batch_key(None) is None


keys = st.one_of(st.none(), st.sampled_from("abc"))


@settings(max_examples=200, deadline=None)
@given(st.lists(keys, max_size=20), st.integers(1, 5))
def test_group_places_every_item_once_in_arrival_order_without_mixing_keys(item_keys, most):
    items = list(enumerate(item_keys))
    groups = batching.group(items, lambda it: it[1], most)
    flat = [it for g in groups for it in g]
    assert sorted(flat) == items  # each item exactly once
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)  # batches start in arrival order
    for g in groups:
        assert len(g) <= most
        assert g == sorted(g)
        ks = {it[1] for it in g}
        assert len(ks) == 1
        if None in ks:
            assert len(g) == 1
    # greedy: a batch that is not full has no later compatible item left out of it
    for g in groups:
        if g[0][1] is not None and len(g) < most:
            later = [it for it in items if it[0] > g[0][0] and it[1] == g[0][1]]
            assert all(it in g for it in later)


def test_group_refuses_a_maximum_below_one():
    with pytest.raises(ValueError):
        batching.group([1], lambda x: x, 0)


@given(st.integers(1, 16), st.one_of(st.none(), st.integers(0, 10**12)), st.integers(0, 10**10))
def test_capacity_is_between_one_and_the_maximum_and_fits_the_memory(most, free, per):
    cap = batching.capacity(most, free, per)
    assert 1 <= cap <= most
    if free is not None and per > 0 and cap > 1:
        assert cap * per <= free


def test_member_bytes_grows_with_tokens_and_doubles_with_guidance():
    kw = dict(text_tokens=16, inner_dim=24, ffn_dim=32, heads=2)
    small = batching.member_bytes(tokens=48, guidance=False, **kw)
    assert batching.member_bytes(tokens=96, guidance=False, **kw) > 2 * small - 1
    assert batching.member_bytes(tokens=48, guidance=True, **kw) == 2 * small


rounds = st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.sets(st.integers(0, 5), min_size=1)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(rounds)
def test_shares_add_up_to_the_rounds_and_follow_participation(plan):
    ledger = batching.ShareLedger()
    for seconds, members in plan:
        ledger.record(seconds, sorted(members))
    assert sum(ledger.share_s(m) for m in range(6)) == pytest.approx(sum(s for s, _ in plan), abs=1e-9)
    for m in range(6):
        took = [(s, ms) for s, ms in plan if m in ms]
        assert ledger.steps(m) == len(took)
        assert ledger.share_s(m) == pytest.approx(sum(s / len(ms) for s, ms in took), abs=1e-9)
        assert ledger.rounds_s(m) == pytest.approx(sum(s for s, _ in took), abs=1e-9)
        assert ledger.widest(m) == max((len(ms) for _, ms in took), default=0)
