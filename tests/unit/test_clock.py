"""``gpufleet.clock.epoch_seconds``: the one reader of the timestamps items carry (numbers, or :func:`iso` strings)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.clock import epoch_seconds, iso


@given(st.integers(0, 4_000_000_000_000))
def test_iso_strings_read_back_to_the_millisecond(ms):
    assert epoch_seconds(iso(ms / 1000)) == pytest.approx(ms / 1000, abs=1e-6)


def test_numbers_pass_and_anything_else_is_none():
    assert epoch_seconds(12) == 12.0 and epoch_seconds(1.5) == 1.5
    assert epoch_seconds("2026-12-04T17:00:00Z") == 1796403600.0
    for bad in (None, "", "yesterday", [1], {"t": 1}):
        assert epoch_seconds(bad) is None
