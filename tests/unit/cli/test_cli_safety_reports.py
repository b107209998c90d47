"""``gpufleet safety report`` / ``reports``: the report body from a job's inspection, reports as an evaluation set."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli.safety import as_labelled, report_body
from gpufleet.errors import ValidationFailed
from gpufleet.safety.evaluation import parse_labelled

INSPECTION = {
    "job": {"job_id": "job_x", "spec": {"workload": {"prompt": "a crowd kicking a man", "negative_prompt": "blurry"}}},
    "events": [
        {"type": "created", "detail": {}},
        {
            "type": "prompt_checked",
            "detail": {
                "allowed": True,
                "nearest_category": "graphic_violence",  # allowed: in no category, the nearest one named as such
                "nearest_score": 0.3,
                "policy_version": "2026-12-02.1",
                "reason": None,
            },
        },
    ],
}


def test_the_report_carries_the_judged_text_and_the_recorded_decision():
    body = report_body(INSPECTION, "unsafe", None, "missed", None)
    assert body == {
        "label": "unsafe",
        "category": "graphic_violence",
        "prompt": "a crowd kicking a man blurry",
        "decision": INSPECTION["events"][1]["detail"],
        "note": "missed",
    }
    assert report_body(INSPECTION, "safe", None, None, 3) == {
        "label": "safe",
        "prompt": "a crowd kicking a man blurry",
        "decision": INSPECTION["events"][1]["detail"],
        "expected_version": 3,
    }
    assert "decision" not in report_body({"job": INSPECTION["job"], "events": []}, "unsafe", "hate", None, None)
    # a decision recorded before allowed prompts' categories were named "nearest" defaults the same way
    old = {**INSPECTION, "events": [{"type": "prompt_checked", "detail": {"allowed": True, "category": "hate"}}]}
    assert report_body(old, "unsafe", None, None, None)["category"] == "hate"
    with pytest.raises(ValidationFailed):
        report_body({"job": {"spec": {"workload": {"image": "x"}}}}, "safe", None, None, None)


def test_stored_reports_read_back_as_a_labelled_set_with_their_decisions():
    stored = [
        {
            "job_id": "job_a",
            "label": "unsafe",
            "category": "hate",
            "prompt": "p1",
            "kind": "false_negative",
            "decision": {"allowed": True},
            "version": 1,
        },
        {"job_id": "job_b", "label": "safe", "prompt": "p2", "version": 2},
    ]
    text = "\n".join(json.dumps(as_labelled(r)) for r in stored)
    rows = parse_labelled(text)
    assert [(r.prompt, r.label, r.category) for r in rows] == [("p1", "unsafe", "hate"), ("p2", "safe", "")]
    assert json.loads(text.splitlines()[0])["decision"] == {"allowed": True}
