"""The near-duplicate scan (gpufleet.safety.overlap) and the held-out splits it guards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufleet.safety.evaluation import read_labelled
from gpufleet.safety.overlap import GramIndex, char_grams, jaccard, nearest

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"


def test_nearest_scores_copies_one_and_unrelated_prompts_near_zero():
    found = nearest(["a dog show with poodles", "A Dog show, with POODLES!"], ["a dog show with poodles", "a ship"])
    assert [(m.nearest, m.similarity) for m in found] == [("a dog show with poodles", 1.0)] * 2
    assert jaccard(char_grams("a dog show with poodles"), char_grams("a dachshund race at a county fair")) < 0.1
    assert 0.3 < jaccard(char_grams("a fisherman holding a trout"), char_grams("a fisherman holding a big trout")) < 1


def test_an_index_built_once_answers_like_nearest_and_skips_the_entries_not_allowed():
    pool = ["a dog show with poodles", "a ship", "a dog show with poodles", "a fisherman holding a big trout"]
    index = GramIndex(pool)
    assert index.pool == ["a dog show with poodles", "a ship", "a fisherman holding a big trout"]  # each once
    rows = ["A Dog show, with POODLES!", "a fisherman holding a trout"]
    assert index.nearest(rows) == nearest(rows, pool)
    skip_dogs = np.array([False, True, True])
    found = {m.prompt: m for m in index.nearest(rows, skip_dogs)}
    assert found["A Dog show, with POODLES!"].nearest != "a dog show with poodles"
    assert found["a fisherman holding a trout"].nearest == "a fisherman holding a big trout"
    assert [m.similarity for m in index.nearest(rows, np.zeros(3, bool))] == [0.0, 0.0]


def test_the_second_held_out_split_copies_no_row_of_the_splits_that_were_fitted_before_it():
    learned = [r.prompt for f in ("train.tsv", "train_translations.tsv", "dev.tsv") for r in read_labelled(DATA / f)]
    held = [r.prompt for f in ("test2.tsv", "translations2.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, learned)[0]
    assert worst.similarity < 0.5, worst


#: the held-out splits from test3 on, each written after the one before it had been measured and before the next
#: policy was chosen (dates and policies: tests/data/prompts/README.md): (the number in its two file names, its rows with
#: translations where counted, also checked against the buried variant's benign paragraph sentences)
HELD_OUT_SPLITS = [("3", None, False), ("4", None, False), ("5", None, False), ("6", None, False),
                   ("7", 420 + 172, True), ("8", 420 + 172, True), ("9", 420 + 172, True),
                   ("10", 420 + 252, True), ("11", 420 + 252, True),
                   ("12", 420 + 252, True), ("13", 420 + 252, True),
                   ("14", 420 + 252, True), ("15", 420 + 252, True),
                   ("16", 420 + 252, True), ("17", 420 + 252, True),
                   ("18", 420 + 252, True), ("19", 420 + 252, True),
                   ("20", 420 + 252, True), ("21", 420 + 252, True),
                   ("22", 420 + 252, True), ("23", 420 + 252, True),
                   ("24", 420 + 252, True), ("25", 420 + 252, True),
                   ("26", 420 + 252, True), ("27", 420 + 252, True),
                   ("28", 420 + 252, True),
                   ("29", 420 + 252, True), ("30", 420 + 252, True), ("31", 420 + 252, True)]  # round h18w15's three


#: where the benign paragraphs' sentences come from, among the files' names
PARAGRAPHS = "BENIGN_PARAGRAPHS"


@pytest.fixture(scope="module")
def corpus() -> tuple[GramIndex, list[frozenset[str]]]:
    """Every prompt of every file and every benign paragraph sentence in one index, built once (a split's check
    then costs its queries, not a rebuild of the others' index), with where each distinct prompt comes from."""
    from gpufleet.safety.evasion import BENIGN_PARAGRAPHS

    origins: dict[str, set[str]] = {}
    for f in sorted(DATA.glob("*.tsv")):
        for r in read_labelled(f):
            origins.setdefault(r.prompt, set()).add(f.name)
    for p in BENIGN_PARAGRAPHS:
        for sentence in (s for s in p.replace("!", ".").replace("?", ".").split(". ") if s.strip()):
            origins.setdefault(sentence, set()).add(PARAGRAPHS)
    index = GramIndex(origins)
    return index, [frozenset(origins[p]) for p in index.pool]


@pytest.mark.parametrize(("digit", "rows", "paragraphs"), HELD_OUT_SPLITS)
def test_a_held_out_split_copies_no_row_of_any_other_split_nor_a_benign_paragraph(corpus, digit, rows, paragraphs):
    index, origins = corpus
    own = {f"test{digit}.tsv", f"translations{digit}.tsv"}  # only the split's own files (a train6 is another's)
    not_others = own | (set() if paragraphs else {PARAGRAPHS})
    allowed = np.array([bool(o - not_others) for o in origins])  # a prompt also in another file stays a candidate
    held = [r.prompt for f in (f"test{digit}.tsv", f"translations{digit}.tsv") for r in read_labelled(DATA / f)]
    assert rows is None or len(held) == rows
    worst = index.nearest(held, allowed)[0]
    assert worst.similarity < 0.4, worst
