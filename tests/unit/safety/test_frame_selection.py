"""Tier-2 frame selection: scene changes plus a uniform floor, every frame of a short clip (pure)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.safety.frame_selection import SamplingPolicy, scene_diffs

policies = st.builds(
    SamplingPolicy, max_frames=st.integers(1, 64), floor=st.integers(1, 16), cut_threshold=st.floats(0.01, 1.0)
)


@given(policies, st.integers(0, 400), st.data())
def test_selection_is_sorted_in_range_within_budget_and_keeps_first_and_last(policy, n, data):
    diffs = data.draw(st.lists(st.floats(0, 1), min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
    idx = policy.indices(n, diffs)
    assert idx == sorted(set(idx)) and all(0 <= i < n for i in idx)
    assert len(idx) <= max(policy.max_frames, 0) or idx == list(range(n))
    if n <= policy.max_frames:
        assert idx == list(range(n))  # a short clip is checked whole
    elif policy.max_frames >= 2 and policy.floor >= 2:
        assert idx[0] == 0 and idx[-1] == n - 1


@given(policies, st.integers(2, 400), st.data())
def test_the_floor_is_uniform_and_cuts_fill_the_budget_largest_first(policy, n, data):
    diffs = data.draw(st.lists(st.floats(0, 1), min_size=n - 1, max_size=n - 1))
    idx = set(policy.indices(n, diffs))
    plain = set(policy.indices(n))
    assert plain <= idx  # cuts only add to the floor
    if n <= policy.max_frames:
        return
    k = min(policy.floor, policy.max_frames)
    floor = sorted(plain)
    assert len(floor) <= k
    if k >= 2:
        assert max(b - a for a, b in zip(floor, floor[1:], strict=False)) <= -(-(n - 1) // (k - 1))
    cuts = [i + 1 for i, d in enumerate(diffs) if d >= policy.cut_threshold]
    missed = [c for c in cuts if c not in idx]
    if missed:  # a cut is dropped only when the budget is spent, and never for a smaller one
        assert len(idx) == policy.max_frames
        kept = [diffs[c - 1] for c in cuts if c in idx and c not in plain]
        assert all(diffs[m - 1] <= min(kept, default=1.0) for m in missed)
    for i in idx - plain:
        assert diffs[i - 1] >= policy.cut_threshold


def test_a_hard_cut_between_two_shots_is_scored_and_the_new_shot_checked():
    rng = np.random.default_rng(7)
    sky = np.full((40, 48, 64, 3), (90, 140, 220), np.uint8)
    shift = np.arange(40)[:, None, None] % 3  # a slow pan: a pixel's worth of motion
    sky = np.clip(sky.astype(int) + shift[..., None], 0, 255).astype(np.uint8)
    other = np.repeat(rng.integers(0, 255, (1, 48, 64, 3), dtype=np.uint8), 3, axis=0)
    video = np.concatenate([sky[:37], other[:3]])  # the last three frames: a short, different scene
    diffs = scene_diffs(video)
    assert diffs.shape == (39,) and diffs[36] > 0.15 and np.delete(diffs, 36).max() < 0.05
    idx = SamplingPolicy(max_frames=12, floor=4).indices(len(video), diffs)
    assert 37 in idx and 0 in idx and 39 in idx and len(idx) == 5
    assert SamplingPolicy(max_frames=40).indices(40, diffs) == list(range(40))


@pytest.mark.parametrize("kw", [{"max_frames": 0}, {"floor": 0}, {"cut_threshold": 0.0}, {"cut_threshold": 1.5}])
def test_a_policy_outside_its_ranges_is_refused(kw):
    with pytest.raises(ValueError):
        SamplingPolicy(**kw)


def test_scene_diffs_of_fewer_than_two_frames_is_empty():
    assert scene_diffs(np.zeros((1, 8, 8, 3), np.uint8)).shape == (0,)
