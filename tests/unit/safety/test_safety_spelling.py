"""Single-edit spelling correction and word splitting (a small dictionary), and the word lists' loading (one list)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.errors import ConfigError
from gpufleet.safety.spelling import _ONE_LETTER_WORDS, Speller, edits1, merged_frequencies, word_counts

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


# the examples of the round after test6 (docs/benchmarks.md): subtitle-like frequencies, "beating" / "dating" /
# "death" among the policy's unsafe exemplar words only, "debating" / "eats" among its safe ones
ROUND7 = {
    "beating": 2.9e-5,
    "debating": 1.8e-6,
    "dating": 3.3e-5,
    "death": 1.7e-5,
    "deaths": 9.6e-6,
    "eats": 1.5e-5,
    "pharmacy": 2e-6,
    "a": 1e-2,
    "porn": 5e-6,
    "pro": 2e-4,
}
UNSAFE_ONLY = frozenset({"beating", "dating", "death", "porn"})
DOMAIN = UNSAFE_ONLY | {"debating", "eats", "deaths", "pharmacy"}


def test_without_the_margin_a_safe_word_becomes_an_unsafe_one_on_frequency_alone():
    s = Speller(ROUND7, domain=DOMAIN)  # policy .5's behaviour
    assert s.correct("dbeating dbating") == "beating dating"
    assert s.correct("apharmacy") == "pharmacy"  # the article dropped


def test_with_the_margin_an_unsafe_only_word_must_be_that_many_times_likelier():
    s = Speller(ROUND7, domain=DOMAIN, unsafe=UNSAFE_ONLY, unsafe_margin=10.0)
    assert s.correct("dbeating dbating") == "debating debating"
    assert s.likelihood("dbeating", "beating") == 2.9e-5 / 10.0  # no domain weight, divided by the margin
    assert s.likelihood("dbeating", "debating") == 1.8e-6 * 3.0  # a safe domain word keeps its weight
    assert s.correct("porrn") == "porn"  # the only candidate: still corrected to the unsafe word
    assert Speller(ROUND7, domain=DOMAIN, unsafe=UNSAFE_ONLY, unsafe_margin=1.0).correct("dbeating") == "beating"


# the margin for substitutions only: a substitution is the rarer slip (SUBSTITUTION_WEIGHT), so a safe word one
# substitution from an unsafe-only one is the case the margin is for; a dropped, doubled or swapped letter is not
SHIRTS = {"shirts": 1e-5, "shits": 5e-5}


def test_margin_substitutions_only_applies_the_margin_to_substitutions_alone():
    unsafe = frozenset({"shits"})
    none = Speller(SHIRTS, domain=unsafe)
    plain = Speller(SHIRTS, domain=unsafe, unsafe=unsafe, unsafe_margin=10.0)
    subs = Speller(SHIRTS, domain=unsafe, unsafe=unsafe, unsafe_margin=10.0, margin_substitutions_only=True)
    assert none.correct("shirs shts") == "shits shits"  # "shirs": r->t substitution; "shts": an i dropped
    assert plain.correct("shirs shts") == "shirts shits"
    assert subs.correct("shirs shts") == "shirts shits"
    assert subs.likelihood("shirs", "shits") == 5e-5 * 0.1 / 10.0  # substitution: divided by the margin
    assert subs.likelihood("shts", "shits") == 5e-5 * 3.0  # insertion: the domain weight, as without the margin
    assert plain.likelihood("shts", "shits") == 5e-5 / 10.0
    # the round-7 example: "dbeating" is a letter too many, so the unsafe-only word keeps its weight
    r7 = Speller(ROUND7, domain=DOMAIN, unsafe=UNSAFE_ONLY, unsafe_margin=10.0, margin_substitutions_only=True)
    assert r7.correct("dbeating dbating") == "beating dating"
    assert r7.correct("porrn") == "porn"
    # without a margin the flag changes nothing
    assert Speller(SHIRTS, domain=unsafe, unsafe=unsafe, margin_substitutions_only=True).correct("shirs") == "shits"


_TYPED = sorted({t for w in ROUND7 if len(w) >= 4 for t in edits1(w) if t.isalpha() and t not in ROUND7})


@given(st.sampled_from(_TYPED), st.sampled_from([1.0, 2.0, 3.0, 5.0, 10.0]))
def test_margin_substitutions_only_is_the_margin_on_substitutions_and_none_elsewhere(typed, margin):
    kw = {"domain": DOMAIN, "unsafe": UNSAFE_ONLY}
    none = Speller(ROUND7, **kw)
    plain = Speller(ROUND7, unsafe_margin=margin, **kw)
    subs = Speller(ROUND7, unsafe_margin=margin, margin_substitutions_only=True, **kw)
    for c in (c for c in edits1(typed) if c in ROUND7 and c != typed):
        substitution = len(c) == len(typed) and sum(a != b for a, b in zip(c, typed, strict=True)) == 1
        expected = plain if substitution else none
        assert subs.likelihood(typed, c) == expected.likelihood(typed, c)


def test_split_article_keeps_a_one_letter_word_apart_from_the_spelled_out_word_after_it():
    s = Speller(ROUND7, domain=DOMAIN, split_article=True)
    assert s.correct("apharmacy shelf") == "a pharmacy shelf"
    assert s.correct("aporn") == "a porn"
    assert s.correct("porn pharmacy") == "porn pharmacy"  # known words are never split
    assert s.correct("xpharmacy") == "pharmacy"  # x is no one-letter word: the edit as before
    assert Speller({**ROUND7, "ape": 1e-5}, split_article=True).correct("ape") == "ape"


@given(st.sampled_from(sorted(_ONE_LETTER_WORDS)), st.sampled_from(sorted(w for w in ROUND7 if len(w) >= 4)))
def test_split_article_property(letter, word):
    s = Speller(ROUND7, split_article=True)
    glued = letter + word
    assert s.correct(glued) == (glued if glued in ROUND7 else f"{letter} {word}")
    assert Speller(ROUND7).correct(word) == s.correct(word) == word


def test_the_speller_options_at_their_defaults_keep_the_fitted_state_digest():
    from gpufleet.safety import fitted
    from gpufleet.safety.policy import default_policy

    shipped = default_policy()  # since 2026-12-04.2 it corrects English prompts only, with English candidates
    assert (shipped.spelling_english_only, shipped.spelling_english_candidates) == (True, True)
    p = shipped.model_copy(update={"spelling_english_only": False, "spelling_english_candidates": False})
    assert (p.spelling_unsafe_margin, p.spelling_split_article, p.spelling_english_only) == (None, False, False)
    unchanged = p.model_copy(
        update={"spelling_unsafe_margin": None, "spelling_split_article": False, "spelling_english_only": False}
    )
    assert fitted.digest(unchanged, "h") == fitted.digest(p, "h")
    assert "spelling_unsafe_margin" not in p.model_dump_json(exclude={"spelling_unsafe_margin": True})
    assert p.spelling_margin_substitutions_only is False
    assert fitted.digest(p.model_copy(update={"spelling_margin_substitutions_only": False}), "h") == fitted.digest(
        p, "h"
    )
    for update in (
        {"spelling_unsafe_margin": 10.0},
        {"spelling_split_article": True},
        {"spelling_english_only": True},
        {"spelling_margin_substitutions_only": True},
        {"spelling_english_candidates": True},
    ):
        assert fitted.digest(p.model_copy(update=update), "h") != fitted.digest(p, "h")


# the round after the speller options (docs/benchmarks.md): Spanish, German and Portuguese words the lists lack were
# rewritten into other words ("despiezando" -> the Portuguese "desprezando", "mausefalle" -> "ma use falle")
LISTS = {
    "en": {"a": 2e-2, "the": 4e-2, "butcher": 1e-5, "pig": 2e-5, "in": 2e-2, "shop": 5e-5, "use": 5e-4, "trick": 3e-5},
    "es": {"un": 2e-2, "carnicero": 1e-6 * 4, "cerdo": 2e-5, "en": 3e-2, "la": 4e-2, "a": 1e-2},
    "de": {"eine": 1e-2, "in": 1e-2, "einer": 5e-3, "falle": 1e-5, "maus": 5e-6, "ma": 2e-6},
    "pt": {"desprezando": 3e-6, "um": 2e-2, "a": 1e-2, "de": 4e-2},
}
MERGED = {w: max(ls[w] for ls in LISTS.values() if w in ls) for w in set().union(*LISTS.values())}


def _speller(english_only: bool) -> Speller:
    return Speller(MERGED, english_only=english_only, languages=LISTS)


def test_language_is_the_likeliest_list_with_english_preferred():
    s = _speller(True)
    assert s.language("un carnicero despiezando un cerdo en la tienda") == "es"
    assert s.language("eine Mausefalle in einer falle".lower()) == "de"
    assert s.language("a buthcer in the shpo") == "en"  # unknown words weigh the same in every language
    assert s.language("") == s.language("123 !!") == "en"
    assert Speller(MERGED).language("un cerdo en la tienda") == "en"  # no lists: English


def test_english_only_leaves_a_prompt_in_another_language_as_it_is():
    es = "un carnicero despiezando un cerdo en la tienda"
    assert _speller(False).correct(es) != es  # policy .5's behaviour: the Spanish word is "corrected"
    assert _speller(False).correct("despiezando") == "desprezando"
    assert _speller(True).correct(es) == es
    de = "eine mausefalle in einer falle"
    assert _speller(True).correct(de) == de
    assert _speller(True).correct("a buthcer in the shpo") == _speller(False).correct("a buthcer in the shpo")
    assert _speller(True).correct("a buthcer in the shpo") == "a butcher in the shop"


WORDS = sorted(MERGED) + ["buthcer", "shpo", "despiezando", "mausefalle", "tienda", "xq"]


@given(st.lists(st.sampled_from(WORDS), max_size=12))
def test_english_only_either_keeps_the_text_or_corrects_it_as_before(words):
    text = " ".join(words)
    on, off = _speller(True), _speller(False)
    assert on.correct(text) == (off.correct(text) if on.language(text) == "en" else text)


# the misspelt false positives of the round after the translations (docs/benchmarks.md): an English prompt's misspelt
# words were corrected to other lists' words ("horo moie" -> the Spanish "oro", the French "moi")
LISTS2 = {
    "en": {"a": 2e-2, "the": 4e-2, "dark": 5e-5, "horror": 1e-5, "movie": 5e-5, "film": 4e-5},
    "es": {"oro": 1e-4, "un": 2e-2, "la": 4e-2, "pelicula": 1e-5},
    "fr": {"moi": 1e-3, "le": 4e-2, "un": 2e-2},
}
MERGED2 = {w: max(ls[w] for ls in LISTS2.values() if w in ls) for w in set().union(*LISTS2.values())}


def _speller2(english_candidates: bool, english_only: bool = True) -> Speller:
    return Speller(
        MERGED2,
        english_only=english_only,
        english_candidates=english_candidates,
        english_words=frozenset(LISTS2["en"]) if english_candidates else frozenset(),
        languages=LISTS2,
    )


def test_english_candidates_correct_an_english_prompt_to_english_words_only():
    assert _speller2(False).correct("a dark horo moie") == "a dark oro moi"  # policy .5's behaviour
    assert _speller2(True).correct("a dark horo moie") == "a dark horo movie"  # no English candidate: kept
    assert _speller2(True, english_only=False).correct("a dark horo moie") == "a dark horo movie"
    assert _speller2(True).correct("un pelicula de oro") == "un pelicula de oro"  # Spanish: left alone
    domain = Speller(MERGED2, english_candidates=True, english_words=frozenset(LISTS2["en"]), domain=frozenset({"oro"}))
    assert domain.correct("the horo") == "the oro"  # the policy's own words stay candidates


WORDS2 = sorted(MERGED2) + ["horo", "moie", "flim", "drak", "thhe", "oroo", "pelicla"]


@given(st.lists(st.sampled_from(WORDS2), min_size=1, max_size=10))
def test_english_candidates_give_english_words_or_keep_the_word(words):
    text = " ".join(words)
    on, off = _speller2(True), _speller2(False)
    if on.language(text) != "en":
        assert on.correct(text) == off.correct(text) == text
        return
    for typed, fixed, before in zip(words, on.correct(text).split(" "), off.correct(text).split(" "), strict=True):
        assert fixed == typed or fixed in LISTS2["en"]
        assert fixed == before or before not in LISTS2["en"]  # only another list's word is given up


# ---- the word lists: read from the wheel, merged in numpy (the same table SpellChecker's lists gave)


def _merged_by_loop(lists: list[dict[str, int]]) -> dict[str, float]:
    """The merge as it was written first: each word's largest relative frequency, one word at a time."""
    freq: dict[str, float] = {}
    for counts in lists:
        total = float(sum(counts.values())) or 1.0
        for w, n in counts.items():
            if n / total > freq.get(w, 0.0):
                freq[w] = n / total
    return freq


_COUNTS = st.dictionaries(st.sampled_from(["a", "de", "la", "moi", "the", "oro", "dass", "sans"]),
                          st.integers(min_value=1, max_value=10**9), max_size=8)


@given(st.lists(_COUNTS, max_size=5))
def test_merged_frequencies_keep_each_words_largest_relative_frequency(lists):
    assert merged_frequencies(lists) == _merged_by_loop(lists)


def test_an_equal_frequency_in_two_lists_and_an_empty_list_merge_like_the_loop():
    lists = [{"de": 5, "la": 5}, {}, {"de": 1, "la": 1}, {"sans": 3}]
    assert merged_frequencies(lists) == _merged_by_loop(lists) == {"de": 0.5, "la": 0.5, "sans": 1.0}


def test_word_counts_are_the_lists_spellchecker_loads():
    from spellchecker import SpellChecker

    assert word_counts("en") == dict(SpellChecker(language="en", distance=1).word_frequency.dictionary)


def test_a_language_without_a_word_list_is_a_config_error():
    with pytest.raises(ConfigError, match="no word list for language 'xx'"):
        word_counts("xx")
