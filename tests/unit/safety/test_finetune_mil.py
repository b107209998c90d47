"""The multiple-instance selection of the encoder fine-tuning (``benchmarks/prompt_filter_finetune_cv.py --mil``,
issue 18 round h18t): a row with several prepared segments is scored by its highest segment, so it is trained on the
segment that scores highest under the current model; single-segment rows keep their one segment, and only the
multi-segment rows' segments are re-scored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from prompt_filter_finetune_cv import highest_segments, mil_pairs, row_segments  # noqa: E402


def _probs(score: dict[int, float]):
    """A stand-in for the model + head: P(safe) = 1 - score; records which segments it was asked about."""
    asked: list[int] = []

    def probabilities(segs: np.ndarray) -> dict[int, np.ndarray]:
        asked.extend(segs.tolist())
        return {int(j): np.array([1 - score[int(j)], score[int(j)]]) for j in segs}

    return probabilities, asked


def test_highest_segment_per_row_first_of_ties():
    rows = [np.array([3, 1, 2]), np.array([5]), np.array([7, 8])]
    score = {1: 0.9, 2: 0.1, 3: 0.2, 5: 0.0, 7: 0.4, 8: 0.4}
    assert highest_segments(rows, score).tolist() == [1, 5, 7]


def test_row_segments_rescores_only_multi_segment_rows():
    seg_idx = [np.array([0]), np.array([1, 2, 3]), np.array([4]), np.array([5, 6])]
    # an unsafe long row whose harm is in its last clause, a safe one whose second clause is the hardest
    probabilities, asked = _probs({1: 0.05, 2: 0.1, 3: 0.97, 5: 0.2, 6: 0.6})
    got = row_segments(seg_idx, np.array([0, 1, 2, 3]), probabilities)
    assert got.tolist() == [0, 3, 4, 6]
    assert sorted(asked) == [1, 2, 3, 5, 6]  # single-segment rows 0 and 2 never scored


def test_row_segments_without_multi_segment_rows_asks_nothing():
    seg_idx = [np.array([0]), np.array([1])]
    probabilities, asked = _probs({})
    assert row_segments(seg_idx, np.array([1, 0]), probabilities).tolist() == [1, 0]
    assert asked == []


def test_mil_pairs_trains_chosen_segments_and_scenes():
    seg_idx = [np.array([0, 1]), np.array([2]), np.array([3, 4]), np.array([5, 6])]
    first = np.array([s[0] for s in seg_idx])
    label = np.array([3, 0, 0, 2])
    train = np.array([True, True, True, False])  # row 3 is held out
    scenes = np.array([9])
    probabilities, asked = _probs({0: 0.1, 1: 0.8, 3: 0.7, 4: 0.3})
    seg, y, moved = mil_pairs(seg_idx, first, label, train, scenes, probabilities)
    assert sorted(zip(seg.tolist(), y.tolist(), strict=True)) == [(1, 3), (2, 0), (3, 0), (9, 0)]
    assert moved == 1  # row 0 moved to its second segment; row 2 stays on its first
    assert 5 not in asked and 6 not in asked
