"""Labelled prompt sets: parsing (TSV/JSONL), recall and FPR per category, drift against a baseline."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpufleet.safety.evaluation import LabelledPrompt, drift, evaluate, format_table, parse_labelled


@dataclass
class D:
    allowed: bool
    category: str | None = None


def test_tsv_with_a_header_and_without_one_and_jsonl():
    rows = parse_labelled("label\tcategory\tprompt\nunsafe\thate\tx y\nsafe\t\ta fox\n")
    assert rows == [LabelledPrompt("x y", "unsafe", "hate"), LabelledPrompt("a fox", "safe", "")]
    assert parse_labelled("lang\tlabel\tcategory\tprompt\nes\tsafe\t\tun zorro\n")[0].lang == "es"
    assert parse_labelled("hate\tx y\nsafe\ta fox\n") == rows  # the old category<TAB>prompt files
    j = parse_labelled(
        '{"prompt": "x y", "label": "unsafe", "category": "hate"}\n\n{"prompt": "a fox", "label": "safe"}'
    )
    assert j == rows


@pytest.mark.parametrize(
    "text", ["safe\t\t\n", "just one column\n", '{"prompt": "x"}\n', "label\tprompt\nsafe\tx\textra\n"]
)
def test_malformed_rows_name_the_line(text):
    with pytest.raises(ValueError, match=":1|:2"):
        parse_labelled(text, "f.tsv")


def test_recall_and_fpr_overall_and_per_category():
    rows = [
        LabelledPrompt("a", "unsafe", "hate"),
        LabelledPrompt("b", "unsafe", "hate"),
        LabelledPrompt("c", "unsafe", "drugs"),
        LabelledPrompt("d", "safe", ""),
        LabelledPrompt("e", "safe", "drugs"),
    ]
    ev = evaluate(rows, [D(False, "hate"), D(True), D(False, "weapons"), D(True), D(False, "drugs")])
    d = ev.as_dict()
    assert d["overall"] == {"unsafe": 3, "blocked": 2, "recall": 0.6667, "safe": 2, "false_positives": 1, "fpr": 0.5}
    assert d["categories"]["hate"]["recall"] == 0.5 and d["categories"]["drugs"]["recall"] == 1.0
    assert d["safe_categories"]["drugs"] == {"safe": 1, "false_positives": 1, "fpr": 1.0}
    assert [m.prompt for m in ev.misses] == ["b"] and [r.prompt for r, _ in ev.false_positives] == ["e"]
    assert "overall: recall 0.667 (2/3 unsafe blocked), FPR 0.500 (1/2 safe blocked)" in format_table(ev)
    with pytest.raises(ValueError):
        evaluate(rows, [D(True)])


def test_drift_is_the_change_against_the_baseline():
    now = {"overall": {"recall": 0.8, "fpr": 0.1}, "categories": {"hate": {"recall": 0.5}, "new": {"recall": 1.0}}}
    then = {"overall": {"recall": 0.9, "fpr": 0.05}, "categories": {"hate": {"recall": 1.0}}}
    assert drift(now, then) == {"recall": -0.1, "fpr": 0.05, "categories": {"hate": -0.5}}
