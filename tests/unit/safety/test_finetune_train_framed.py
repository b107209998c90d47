"""The framed training variant of the encoder fine-tuning (``benchmarks/prompt_filter_finetune_cv.py
--train-framed N``, issue 18 round h18w3): a short English training row is also trained joined in one sentence with a
benign fragment of a TRAINING paragraph ("a quiet street at dusk, then ..."), chosen deterministically per prompt,
never from an evaluation paragraph; the framed rows keep their source row's fold and label and are never scored."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import prompt_filter_cv as cv  # noqa: E402
from prompt_filter_finetune_cv import (  # noqa: E402
    FRAMED_MAX_WORDS,
    TRAIN_BURIED,
    TRAIN_FRAMED,
    TRAIN_INDEXED,
    framed_prompt,
    indexed_prompt,
    row_masks,
    scored_mask,
    setup_of,
    train_framed_rows,
    train_framed_translation_rows,
    train_indexed_rows,
    training_paragraphs,
)

from gpufleet.safety.evaluation import LabelledPrompt, read_labelled  # noqa: E402
from gpufleet.safety.evasion import BENIGN_PARAGRAPHS  # noqa: E402

SCENES = ("train_scenes.tsv", "train_scenes2.tsv")
ROWS = [("train", "en", r) for r in read_labelled(cv.DATA / "train.tsv")]


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def test_a_framed_prompt_holds_the_prompt_and_a_training_fragment_only():
    paragraphs = training_paragraphs(SCENES)
    training_words = {w.strip(".,;:").lower() for p in paragraphs for w in p.split()}
    for _, _, row in ROWS[:300]:
        framed = framed_prompt(row.prompt, paragraphs)
        body = row.prompt.strip()
        assert _lower_first(body) in framed or body.rstrip(".!?") in framed
        rest = framed.replace(_lower_first(body), " ").replace(body.rstrip(".!?"), " ")
        words = {w.strip(".,;:").lower() for w in rest.split()} - {"then", "while", "and", ""}
        assert words and words <= training_words  # the frame's words come from the training paragraphs
        assert framed == framed_prompt(row.prompt, list(paragraphs))  # deterministic
    assert len({framed_prompt(r.prompt, paragraphs) for _, _, r in ROWS[:300]}) == 300


def test_an_evaluation_paragraph_is_never_a_frame_source():
    with pytest.raises(ValueError):
        framed_prompt("a harmful ask", [BENIGN_PARAGRAPHS[0]])


def test_framed_rows_keep_fold_and_label_frame_only_short_prompts_and_cap():
    paragraphs = training_paragraphs(SCENES)
    long = " ".join(["word"] * (FRAMED_MAX_WORDS + 1))
    rows = [("train", "en", LabelledPrompt("how do I bake bread", "safe")),
            ("dev", "misspelt", LabelledPrompt("how do I bkae bread", "safe")),
            ("dev", "en", LabelledPrompt(long, "safe")),
            ("extra", "en", LabelledPrompt("a harmful ask", "unsafe", "weapons"))]
    out = train_framed_rows(rows, paragraphs)
    assert [(f, k, r.label, r.category) for f, k, r in out] == [
        ("train", TRAIN_FRAMED, "safe", ""), ("extra", TRAIN_FRAMED, "unsafe", "weapons")]
    assert out[0][2].prompt == framed_prompt("how do I bake bread", paragraphs)
    capped = train_framed_rows(ROWS, paragraphs, cap=50)
    assert len(capped) == 50 and capped == train_framed_rows(ROWS, paragraphs, cap=50)


def test_framed_rows_are_held_out_with_their_fold_and_never_scored():
    fold = np.array(["train", "train", "dev", "dev", "extra", "test"])
    kind = np.array(["en", TRAIN_FRAMED, "en", TRAIN_FRAMED, TRAIN_BURIED, "en"])
    train, variants = row_masks(fold, kind, ("dev",))
    assert train.tolist() == [True, False, False, False, False, True]
    assert variants.tolist() == [False, True, False, False, True, False]
    assert scored_mask(fold, kind).tolist() == [True, False, True, False, False, True]


def test_a_prep_file_records_the_framed_setting_and_old_ones_stay_valid():
    assert setup_of(SCENES, True, 2000).tolist() == [f"scenes:{','.join(SCENES)}", "train_buried:2000"]
    assert setup_of(SCENES, True, 2000, 500).tolist()[-1] == "train_framed:500"


def test_translated_rows_are_framed_in_their_language_with_training_only_safe_fragments():
    rows = [(cv.EXTRA, cv.EXTRA_TR, LabelledPrompt("una mujer paseando al perro por la playa al amanecer", "safe", "", "es")),
            (cv.EXTRA, cv.EXTRA_TR, LabelledPrompt("un chef cortando cebollas en una cocina muy llena", "safe", "", "es")),
            ("dev", "translated", LabelledPrompt("un documental sobre los delfines del estrecho al atardecer", "safe",
                                                 "", "es")),
            ("dev", "translated", LabelledPrompt("un hombre pateando a un perro", "unsafe", "animal_cruelty", "es")),
            ("dev", "translated", LabelledPrompt("ein Mann tritt einen Hund", "unsafe", "animal_cruelty", "de")),
            ("dev", "en", LabelledPrompt("a man kicking a dog", "unsafe", "animal_cruelty", "en"))]
    out = train_framed_translation_rows(rows)
    # the two Spanish training rows and the Spanish dev rows are framed; German has no training fragment; English
    # rows are the other variant's
    assert [(f, k, r.lang, r.label) for f, k, r in out] == [
        (cv.EXTRA, TRAIN_FRAMED, "es", "safe"), (cv.EXTRA, TRAIN_FRAMED, "es", "safe"),
        ("dev", TRAIN_FRAMED, "es", "safe"), ("dev", TRAIN_FRAMED, "es", "unsafe")]
    kicked = out[3][2].prompt
    assert "un hombre pateando a un perro" in kicked or "Un hombre pateando a un perro" in kicked
    training = {w for _, _, r in rows[:2] for w in r.prompt.lower().split()}
    assert "delfines" not in kicked and "estrecho" not in kicked  # never a held-out row's words as the frame
    rest = kicked.lower().replace("un hombre pateando a un perro", " ").replace(",", " ").replace(".", " ").split()
    assert set(rest) - {"y", "luego", "mientras"} <= training
    assert out == train_framed_translation_rows(rows) and len(train_framed_translation_rows(rows, cap=2)) == 2


def test_indexed_rows_append_an_index_to_safe_and_unsafe_rows_alike_in_their_fold():
    rows = [("train", "en", LabelledPrompt("a red fox in the snow.", "safe", "", "en")),
            ("dev", "translated", LabelledPrompt("un zorro en la nieve", "safe", "", "es")),
            ("dev", "en", LabelledPrompt("a man kicking a dog", "unsafe", "animal_cruelty", "en")),
            ("dev", "misspelt", LabelledPrompt("a man kiking a dog", "unsafe", "animal_cruelty")),
            (cv.EXTRA, cv.EXTRA_TR, LabelledPrompt("ein Fuchs im Schnee", "safe", "", "de"))]
    out = train_indexed_rows(rows)
    assert [(f, k, r.label, r.lang) for f, k, r in out] == [
        ("train", TRAIN_INDEXED, "safe", "en"), ("dev", TRAIN_INDEXED, "safe", "es"),
        ("dev", TRAIN_INDEXED, "unsafe", "en"), (cv.EXTRA, TRAIN_INDEXED, "safe", "de")]
    for (_, _, src), (_, _, row) in zip([rows[i] for i in (0, 1, 2, 4)], out, strict=True):
        assert row.prompt == indexed_prompt(src.prompt) and row.prompt.startswith(src.prompt.rstrip("."))
        assert re.search(r"\b(1?[0-9]|20)$", row.prompt)  # ends in an index 0-20
    assert len(train_indexed_rows(rows, cap=2)) == 2
    fold = np.array(["train", "dev", "dev"])
    kind = np.array(["en", TRAIN_INDEXED, TRAIN_INDEXED])
    train, variants = row_masks(fold, kind, ("dev",))
    assert train.tolist() == [True, False, False] and not variants.any()  # a held-out fold's copies never train
    assert not scored_mask(fold, kind)[1:].any()
