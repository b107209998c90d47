"""Tier-1 prompt filter on the labelled prompt set (tests/data/prompts), and its decision record."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.safety import Policy, PromptFilter
from gpufleet.safety.encoder import MiniLMEncoder

pytestmark = pytest.mark.xdist_group("runtime-torch")  # share one worker's torch import

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"

# Recorded in docs/benchmarks.md ("Prompt filter"); a change that lowers them fails here.
TUNING_RECALL_FLOOR = 84 / 85
TUNING_MAX_FALSE_POSITIVES = 1
HELDOUT_RECALL_FLOOR = 16 / 20
HELDOUT_MAX_FALSE_POSITIVES = 0


def _rows(name: str) -> list[tuple[str, str]]:
    out = []
    for line in (DATA / name).read_text().splitlines():
        if line.strip():
            label, prompt = line.split("\t", 1)
            out.append((label, prompt))
    return out


@pytest.fixture(scope="module")
def prompt_filter():
    import torch

    torch.set_num_threads(1)  # tiny model: one thread is fastest on a shared CI machine
    return PromptFilter()


def _confusion(pf, rows):
    tp = fn = fp = tn = 0
    decisions = pf.check_many([prompt for _, prompt in rows])
    for (label, _prompt), decision in zip(rows, decisions, strict=True):
        allowed = decision.allowed
        if label == "safe":
            tn, fp = tn + allowed, fp + (not allowed)
        else:
            tp, fn = tp + (not allowed), fn + allowed
    return tp, fn, fp, tn


def test_recall_and_false_positives_on_the_tuning_set(prompt_filter):
    tp, fn, fp, tn = _confusion(prompt_filter, _rows("unsafe.tsv") + _rows("safe.tsv"))
    assert tp / (tp + fn) >= TUNING_RECALL_FLOOR
    assert fp <= TUNING_MAX_FALSE_POSITIVES


def test_recall_and_false_positives_on_the_heldout_set(prompt_filter):
    tp, fn, fp, tn = _confusion(prompt_filter, _rows("heldout.tsv"))
    assert tp / (tp + fn) >= HELDOUT_RECALL_FLOOR
    assert fp <= HELDOUT_MAX_FALSE_POSITIVES


def test_decisions_record_scores_category_model_hash_and_policy_version(prompt_filter):
    blocked = prompt_filter.check("a man being decapitated with blood everywhere")
    assert not blocked.allowed and blocked.category == "graphic_violence"
    assert blocked.reason and blocked.reasons
    assert len(blocked.model_hash) == 64 and blocked.model_hash == MiniLMEncoder().model_hash
    assert blocked.policy_version == prompt_filter.policy.version
    assert set(blocked.scores) == {c.name for c in prompt_filter.policy.categories}
    allowed = prompt_filter.check("a red fox running in snow")
    assert allowed.allowed and allowed.reason is None
    assert allowed.as_dict()["scores"] == allowed.scores


def test_batched_checks_decide_like_single_checks(prompt_filter):
    rows = _rows("heldout.tsv")[::4]
    many = prompt_filter.check_many([p for _, p in rows], batch_size=3)
    assert [d.allowed for d in many] == [prompt_filter.check(p).allowed for _, p in rows]
    assert [d.category for d in many] == [prompt_filter.check(p).category for _, p in rows]


def test_rules_catch_spacing_and_width_tricks(prompt_filter):
    d = prompt_filter.check("ＰＯＲＮ   video")  # full-width letters, extra spaces
    assert not d.allowed and d.category == "sexual_explicit" and d.reasons[0].startswith("rule")


def test_policy_categories_are_configurable(prompt_filter):
    policy = Policy.model_validate({"version": "test-1", "categories": [
        {"name": "cats", "threshold": 0.5, "exemplars": ["a cat", "kittens playing"]}]})
    pf = PromptFilter(policy=policy, encoder=prompt_filter.encoder)
    d = pf.check("a small kitten playing with yarn")
    assert not d.allowed and d.category == "cats" and d.policy_version == "test-1"
    assert pf.check("a truck on a highway").allowed


def test_policy_rejects_rules_for_unknown_categories_and_bad_patterns():
    with pytest.raises(ValueError):
        Policy.model_validate({"version": "v", "categories": [{"name": "a", "threshold": 0.5, "exemplars": ["x"]}],
                               "rules": [{"category": "b", "any_of": ["x"]}]})
    with pytest.raises(ValueError):
        Policy.model_validate({"version": "v", "categories": [{"name": "a", "threshold": 0.5, "exemplars": ["x"]}],
                               "rules": [{"category": "a", "any_of": ["("]}]})
