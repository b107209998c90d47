"""Single-edit spelling correction and word splitting (a small dictionary; no word lists loaded)."""

from __future__ import annotations

from gpufleet.safety.spelling import Speller, edits1

FREQ = {
    "naked": 1e-4,
    "girl": 1e-3,
    "around": 1e-3,
    "giving": 1e-4,
    "a": 1e-2,
    "puppy": 1e-5,
    "heroin": 1e-5,
    "heroine": 1e-5,
    "of": 1e-2,
    "the": 1e-2,
    "park": 1e-4,
    "in": 1e-2,
}


def test_edits1_covers_drops_swaps_substitutions_and_insertions():
    e = edits1("girl")
    assert {"gil", "igrl", "gurl", "giirl"} <= e and "girl" in e


def test_misspelt_words_are_corrected_and_known_ones_kept():
    s = Speller(FREQ)
    assert s.correct("a nakd girrl arund") == "a naked girl around"
    assert s.correct("heroine heroin") == "heroine heroin"  # both known: neither is "corrected"
    assert s.correct("a zzyzx, naked!") == "a zzyzx, naked!"  # no candidate: unchanged; punctuation kept
    assert s.correct("nak3d") == "nak3d"  # not purely alphabetic: left to normalisation


def test_joined_words_are_split_back():
    s = Speller(FREQ)
    assert s.correct("givingapuppy") == "giving a puppy"
    assert s.correct("intheparkk") == "intheparkk"  # not split unless every part is known


def test_a_substitution_weighs_less_than_a_swap_and_the_policy_words_more():
    freq = {"mehr": 1e-3, "meth": 5e-5, "going": 1e-3, "growing": 4e-4}
    plain = Speller(freq, substitution_weight=1.0, domain_weight=1.0)
    assert plain.correct("meht gowing") == "mehr going"  # frequency alone: the common German word
    weighed = Speller(freq, domain=frozenset({"meth", "growing"}), substitution_weight=0.1, domain_weight=3.0)
    assert weighed.correct("meht gowing") == "meth growing"
    assert weighed.likelihood("meht", "mehr") == 1e-3 * 0.1 and weighed.likelihood("meht", "meth") == 5e-5 * 3.0
