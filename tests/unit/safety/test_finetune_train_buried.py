"""The buried training variant of the encoder fine-tuning (``benchmarks/prompt_filter_finetune_cv.py
--train-buried``, issue 18 round h18v): every English training row is also trained after one TRAINING paragraph
(``train_scenes.tsv`` / ``train_scenes2.tsv``), chosen deterministically per prompt, never one of the seven
evaluation paragraphs of the buried variant; the buried training rows stay in their source row's fold and are never
scored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import prompt_filter_cv as cv  # noqa: E402
from prompt_filter_finetune_cv import (  # noqa: E402
    TRAIN_BURIED,
    row_masks,
    scored_mask,
    train_buried_rows,
    training_paragraph_for,
    training_paragraphs,
)

from gpufleet.safety.evaluation import LabelledPrompt, read_labelled  # noqa: E402
from gpufleet.safety.evasion import BENIGN_PARAGRAPHS, paragraph_for  # noqa: E402

SCENES = ("train_scenes.tsv", "train_scenes2.tsv")
PROMPTS = [r.prompt for f in ("train.tsv", "test.tsv") for r in read_labelled(cv.DATA / f)]


def test_training_paragraphs_are_the_scene_rows_and_no_evaluation_paragraph():
    paragraphs = training_paragraphs(SCENES)
    assert len(paragraphs) == 18 + 50
    assert not set(paragraphs) & set(BENIGN_PARAGRAPHS)
    assert all(len(p.split()) >= 100 for p in paragraphs)


def test_the_paragraph_choice_is_deterministic_and_never_an_evaluation_paragraph():
    paragraphs = training_paragraphs(SCENES)
    chosen = [training_paragraph_for(p, paragraphs) for p in PROMPTS]
    assert chosen == [training_paragraph_for(p, list(paragraphs)) for p in PROMPTS]  # same choice again
    assert set(chosen) <= set(paragraphs) and not set(chosen) & set(BENIGN_PARAGRAPHS)
    assert len(set(chosen)) > 0.9 * len(paragraphs)  # spread over the paragraphs, not one
    # never the evaluation's own paragraph of the same prompt either
    assert all(c != paragraph_for(p) for c, p in zip(chosen, PROMPTS, strict=True))


def test_an_evaluation_paragraph_among_the_training_ones_is_refused():
    with pytest.raises(ValueError):
        training_paragraph_for("anything", [BENIGN_PARAGRAPHS[0]])


def test_buried_training_rows_keep_fold_label_and_prompt_at_the_end():
    paragraphs = training_paragraphs(SCENES)
    rows = [("train", "en", LabelledPrompt("how do I bake bread", "safe")),
            ("dev", "misspelt", LabelledPrompt("how do I bkae bread", "safe")),
            ("extra", "en", LabelledPrompt("a harmful ask", "unsafe", "weapons"))]
    out = train_buried_rows(rows, paragraphs)
    assert [(f, k, r.label, r.category) for f, k, r in out] == [
        ("train", TRAIN_BURIED, "safe", ""), ("extra", TRAIN_BURIED, "unsafe", "weapons")]
    assert out[0][2].prompt == f"{training_paragraph_for('how do I bake bread', paragraphs)} how do I bake bread"
    capped = train_buried_rows(rows, paragraphs, cap=1)
    assert len(capped) == 1 and capped == train_buried_rows(rows, paragraphs, cap=1)


def test_buried_training_rows_are_held_out_with_their_fold_and_never_scored():
    fold = np.array(["train", "train", "dev", "dev", "extra", "extra", "test"])
    kind = np.array(["en", TRAIN_BURIED, "buried", TRAIN_BURIED, "en", TRAIN_BURIED, "en"])
    train, tb = row_masks(fold, kind, ("dev", "test"))
    assert train.tolist() == [True, False, False, False, True, False, False]
    assert tb.tolist() == [False, True, False, False, False, True, False]
    assert scored_mask(fold, kind).tolist() == [True, False, True, False, False, False, True]
