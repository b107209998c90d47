"""``gpufleet safety calibrate``: thresholds per prompt condition chosen on an operator's labelled file, written as a
policy (and its fitted state) that ``safety eval`` and CheckPrompt load; conditions the file barely covers keep the
policy's thresholds; bad input is a message and a non-zero exit with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli.main import main
from gpufleet.safety import fitted
from gpufleet.safety.evaluation import read_labelled
from gpufleet.safety.policy import default_policy

pytestmark = pytest.mark.xdist_group("prompt-filter")  # beside the other modules that load the encoder

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"


def _labelled(tmp_path: Path) -> Path:
    """Every third row of a seen held-out split (140: plain and long English prompts, safe and unsafe)."""
    rows = read_labelled(DATA / "test14.tsv")[::3]
    f = tmp_path / "mine.tsv"
    f.write_text("label\tcategory\tprompt\n" + "".join(f"{r.label}\t{r.category}\t{r.prompt}\n" for r in rows))
    return f


def test_calibrated_policy_keeps_the_budget_on_its_file_and_loads_with_its_fitted_state(tmp_path, capsys):
    f, out = _labelled(tmp_path), tmp_path / "policy"
    assert main(["safety", "calibrate", str(f), "--out", str(out), "--max-fpr", "0.02", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    written = out / "policy.json"
    policy = default_policy(str(written))
    assert policy.version == f"{default_policy().version}+calibrated" and result["written"] == str(written)
    th = result["thresholds"]
    assert policy.logistic.threshold == th["plain"]
    assert policy.logistic.condition_thresholds == {c: th[c] for c in ("long", "other_language", "corrected")}
    # every condition without 20 safe prompts in the file keeps the packaged policy's threshold
    packaged = default_policy().logistic
    assert set(result["kept"]) == {c for c, n in result["safe_per_condition"].items() if n < 20}
    assert {"other_language", "corrected"} <= set(result["kept"]) and "plain" not in result["kept"]
    for c in result["kept"]:
        assert th[c] == packaged.threshold_for("", None if c == "plain" else c)
    # the head is the packaged one: its fitted state is found for the new policy
    assert fitted.load(fitted.fitted_path(written), policy, _model_hash()) is not None
    # measured on the same file by `safety eval` with that policy: within the budget, as calibrate said
    assert main(["safety", "eval", str(f), "--policy", str(written), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)["evaluation"]["overall"]
    assert ev["fpr"] <= 0.02 and ev["fpr"] == result["in_sample"]["en"]["fpr"]
    assert ev["recall"] == result["in_sample"]["en"]["recall"]


def _model_hash() -> str:
    from gpufleet.safety.prompt_filter import PromptFilter

    return PromptFilter.default().encoder.model_hash


@pytest.mark.parametrize(
    "args, content, message",
    [
        ([], "label\tcategory\tprompt\nsafe\t\ta red fox in the snow\n", "both safe and unsafe"),
        (["--max-fpr", "1.5"], None, "--max-fpr"),
        (["--policy", "/nonexistent/policy.json"], None, "policy /nonexistent/policy.json"),
    ],
)
def test_bad_input_is_a_message_and_a_non_zero_exit_and_nothing_is_written(tmp_path, capsys, args, content, message):
    f = _labelled(tmp_path)
    if content is not None:
        f.write_text(content)
    out = tmp_path / "policy"
    assert main(["safety", "calibrate", str(f), "--out", str(out), *args]) == 1
    assert message in capsys.readouterr().err
    assert not (out / "policy.json").exists()


def test_an_existing_policy_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "policy"
    out.mkdir()
    (out / "policy.json").write_text("{}")
    assert main(["safety", "calibrate", str(_labelled(tmp_path)), "--out", str(out)]) == 1
    assert "exists" in capsys.readouterr().err and (out / "policy.json").read_text() == "{}"
