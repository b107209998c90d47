"""The near-duplicate scan (gpufleet.safety.overlap) and the held-out splits it guards."""

from __future__ import annotations

from pathlib import Path

from gpufleet.safety.evaluation import read_labelled
from gpufleet.safety.overlap import char_grams, jaccard, nearest

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"


def test_nearest_scores_copies_one_and_unrelated_prompts_near_zero():
    found = nearest(["a dog show with poodles", "A Dog show, with POODLES!"], ["a dog show with poodles", "a ship"])
    assert [(m.nearest, m.similarity) for m in found] == [("a dog show with poodles", 1.0)] * 2
    assert jaccard(char_grams("a dog show with poodles"), char_grams("a dachshund race at a county fair")) < 0.1
    assert 0.3 < jaccard(char_grams("a fisherman holding a trout"), char_grams("a fisherman holding a big trout")) < 1


def test_the_second_held_out_split_copies_no_row_of_the_splits_that_were_fitted_before_it():
    learned = [r.prompt for f in ("train.tsv", "train_translations.tsv", "dev.tsv") for r in read_labelled(DATA / f)]
    held = [r.prompt for f in ("test2.tsv", "translations2.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, learned)[0]
    assert worst.similarity < 0.5, worst


def test_the_third_held_out_split_copies_no_row_of_any_other_split():
    # from policy 2026-12-02.4 the policy learns from train, test, test2 and their translations; test3 is held out
    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "3" not in f.name for r in read_labelled(f)]
    held = [r.prompt for f in ("test3.tsv", "translations3.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, others)[0]
    assert worst.similarity < 0.4, worst


def test_the_fourth_held_out_split_copies_no_row_of_any_other_split():
    # test4 was written after test3 had been measured, before the policy that followed it was chosen
    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "4" not in f.name for r in read_labelled(f)]
    held = [r.prompt for f in ("test4.tsv", "translations4.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, others)[0]
    assert worst.similarity < 0.4, worst


def test_the_fifth_held_out_split_copies_no_row_of_any_other_split():
    # test5 was written after test4 had been measured twice, before the policy that followed 2026-12-03.2 was chosen
    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "5" not in f.name for r in read_labelled(f)]
    held = [r.prompt for f in ("test5.tsv", "translations5.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, others)[0]
    assert worst.similarity < 0.4, worst


def test_the_sixth_held_out_split_copies_no_row_of_any_other_split():
    # test6 was written after test5 had been measured twice, before the policy that followed 2026-12-03.4 was chosen
    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "6" not in f.name for r in read_labelled(f)]
    held = [r.prompt for f in ("test6.tsv", "translations6.tsv") for r in read_labelled(DATA / f)]
    worst = nearest(held, others)[0]
    assert worst.similarity < 0.4, worst


def test_the_seventh_held_out_split_copies_no_row_of_any_other_split_nor_a_benign_paragraph():
    # test7 was written after test6 had been measured, before the policy that follows 2026-12-03.5 was chosen
    from gpufleet.safety.evasion import BENIGN_PARAGRAPHS

    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "7" not in f.name for r in read_labelled(f)]
    sentences = [s for p in BENIGN_PARAGRAPHS for s in p.replace("!", ".").replace("?", ".").split(". ") if s.strip()]
    held = [r.prompt for f in ("test7.tsv", "translations7.tsv") for r in read_labelled(DATA / f)]
    assert len(held) == 420 + 172
    worst = nearest(held, others + sentences)[0]
    assert worst.similarity < 0.4, worst


def test_the_eighth_held_out_split_copies_no_row_of_any_other_split_nor_a_benign_paragraph():
    # test8 was written after test7 had been measured, before the policy that follows 2026-12-03.5 was tuned
    from gpufleet.safety.evasion import BENIGN_PARAGRAPHS

    others = [r.prompt for f in sorted(DATA.glob("*.tsv")) if "8" not in f.name for r in read_labelled(f)]
    sentences = [s for p in BENIGN_PARAGRAPHS for s in p.replace("!", ".").replace("?", ".").split(". ") if s.strip()]
    held = [r.prompt for f in ("test8.tsv", "translations8.tsv") for r in read_labelled(DATA / f)]
    assert len(held) == 420 + 172
    worst = nearest(held, others + sentences)[0]
    assert worst.similarity < 0.4, worst
