"""The prompt conditions the logistic head's per-condition thresholds key on (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.safety.conditions import condition


def test_each_condition_and_the_plain_prompt():
    assert condition(1, "en", False) is None
    assert condition(1, "en", True) == "corrected"
    assert condition(1, "es", False) == "other_language"
    assert condition(3, "en", False) == "long"


@given(st.integers(min_value=0, max_value=9), st.sampled_from(["en", "es", "fr", "de", "pt"]), st.booleans())
def test_the_first_condition_that_holds_names_the_prompt(segments, language, corrected):
    got = condition(segments, language, corrected)
    holds = [
        name
        for name, ok in (("long", segments > 1), ("other_language", language != "en"), ("corrected", corrected))
        if ok
    ]
    assert got == (holds[0] if holds else None)
