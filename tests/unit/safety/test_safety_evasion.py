"""The evasion variants' buried kind: several benign paragraphs, one per prompt by a stable hash (pure)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gpufleet.safety.evaluation import read_labelled
from gpufleet.safety.evasion import BENIGN_PARAGRAPH, BENIGN_PARAGRAPHS, buried, paragraph_for, variants

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"


def test_every_benign_paragraph_is_long_and_distinct_and_the_first_is_the_named_one():
    assert len(BENIGN_PARAGRAPHS) >= 6 and len(set(BENIGN_PARAGRAPHS)) == len(BENIGN_PARAGRAPHS)
    assert all(len(p.split()) >= 200 for p in BENIGN_PARAGRAPHS)
    assert BENIGN_PARAGRAPH == BENIGN_PARAGRAPHS[0] and BENIGN_PARAGRAPH.startswith("A quiet morning")


def test_a_prompt_is_buried_after_the_paragraph_its_hash_picks_and_always_the_same_one():
    prompt = "a red fox running in snow"
    assert buried(prompt) == f"{paragraph_for(prompt)} {prompt}" == buried(prompt)
    assert paragraph_for(prompt) in BENIGN_PARAGRAPHS


def test_a_split_is_buried_after_every_paragraph_not_one():
    rows = read_labelled(DATA / "test5.tsv")
    deep = variants(rows, ["buried"])["buried"]
    used = Counter(next(p for p in BENIGN_PARAGRAPHS if d.prompt.startswith(p)) for d in deep)
    assert set(used) == set(BENIGN_PARAGRAPHS)
    assert max(used.values()) < len(rows) / 3  # none dominates
    assert all(d.prompt.endswith(r.prompt) and d.label == r.label for d, r in zip(deep, rows, strict=True))
