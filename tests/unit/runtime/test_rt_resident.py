"""Which resident models a warm worker evicts before loading another (pure), and the holder around it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.runtime.resident import ModelKey, Resident, ResidentModels, plan_evictions


def key(name: str, h: str = "h", device: str = "cpu") -> ModelKey:
    return ModelKey(name, h, device)


def test_the_default_budget_keeps_the_last_model_only():
    resident = (Resident(key("a"), 100, 1),)
    assert plan_evictions(resident, key("b"), 100, 0) == (key("a"),)


def test_a_resident_model_evicts_nothing():
    resident = (Resident(key("a"), 100, 1), Resident(key("b"), 100, 2))
    assert plan_evictions(resident, key("a"), 100, 0) == ()


def test_least_recently_used_goes_first_until_the_wanted_model_fits():
    resident = (Resident(key("a"), 100, 3), Resident(key("b"), 100, 1), Resident(key("c"), 100, 2))
    assert plan_evictions(resident, key("d"), 100, 300) == (key("b"),)
    assert plan_evictions(resident, key("d"), 150, 300) == (key("b"), key("c"))


def test_a_republished_model_under_the_same_name_is_always_evicted():
    resident = (Resident(key("a", "old"), 100, 5),)
    assert plan_evictions(resident, key("a", "new"), 100, 10_000) == (key("a", "old"),)


residents = st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 500)), max_size=6, unique_by=lambda t: t[0])


@given(residents, st.sampled_from("abcdefg"), st.integers(0, 500), st.integers(0, 2000))
def test_what_is_kept_fits_or_only_the_wanted_model_is_left(entries, wanted, size, budget):
    resident = tuple(Resident(key(n), s, i) for i, (n, s) in enumerate(entries))
    evict = plan_evictions(resident, key(wanted), size, budget)
    assert key(wanted) not in evict
    if any(r.key == key(wanted) for r in resident):
        assert evict == ()
        return
    kept = [r for r in resident if r.key not in evict]
    assert size + sum(r.size_bytes for r in kept) <= budget or not kept
    # least recently used first: everything evicted is older than everything kept
    if evict and kept:
        assert max(r.last_used for r in resident if r.key in evict) < min(r.last_used for r in kept)


def test_the_holder_loads_once_and_evicts_by_plan(tmp_path):
    loads = []
    folders = {}
    for name in ("a", "b"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "w.bin").write_bytes(b"x" * 10)
    held = ResidentModels(budget_bytes=0)

    def get(name):
        return held.pipeline(key(name), folders[name], lambda: loads.append(name) or f"pipe-{name}")

    assert get("a") == ("pipe-a", False)
    assert get("a") == ("pipe-a", True)
    assert held.names() == ["a"]
    assert get("b") == ("pipe-b", False)
    assert held.names() == ["b"]
    assert get("a") == ("pipe-a", False)
    assert loads == ["a", "b", "a"]
    two = ResidentModels(budget_bytes=20)
    two.pipeline(key("a"), folders["a"], lambda: "pa")
    two.pipeline(key("b"), folders["b"], lambda: "pb")
    assert two.names() == ["a", "b"]
