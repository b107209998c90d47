"""Clauses and word windows of a prompt (what the tier-1 filter judges)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.safety.segments import segment, windows


def test_a_short_prompt_is_one_clause_and_one_window():
    sg = segment("a red fox running in snow")
    assert sg.clauses == ("a red fox running in snow",) and sg.windows == sg.clauses
    assert sg.all() == ("a red fox running in snow",)


def test_sentences_are_clauses_and_the_whole_text_a_window():
    sg = segment("children play in a park. later, a nude statue in a museum.")
    assert sg.clauses == ("children play in a park.", "later, a nude statue in a museum.")
    assert sg.windows == ("children play in a park. later, a nude statue in a museum.",)


def test_long_text_is_covered_by_overlapping_windows_to_the_last_word():
    words = [f"w{i}" for i in range(100)]
    ws = windows(words, 32, 16)
    assert ws[0].split()[0] == "w0" and ws[-1].split()[-1] == "w99"
    assert all(len(w.split()) == 32 for w in ws)
    starts = [int(w.split()[0][1:]) for w in ws]
    assert starts == [0, 16, 32, 48, 64, 68]


@given(st.integers(1, 300), st.integers(1, 40), st.data())
def test_every_word_is_in_some_window(n, window, data):
    stride = data.draw(st.integers(1, window))
    words = [f"w{i}" for i in range(n)]
    covered = {w for win in windows(words, window, stride) for w in win.split()}
    assert covered == set(words)


def test_a_request_after_a_long_benign_paragraph_has_its_own_clause():
    text = " ".join(["a calm harbour at dawn."] * 50) + " a man beheading a prisoner"
    sg = segment(text)
    assert "a man beheading a prisoner" in sg.clauses
    assert any(w.endswith("a man beheading a prisoner") for w in sg.windows)


def test_bad_window_settings_are_refused():
    with pytest.raises(ValueError):
        segment("x", window=8, stride=9)
