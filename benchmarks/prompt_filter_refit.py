r"""Refit a built candidate's per-condition thresholds on seen held-out splits (issue 18, round h18x).

A candidate from ``benchmarks/prompt_filter_finetune_build.py`` takes its per-condition thresholds from the
cross-validation's out-of-fold scores; on the fresh splits written since (test12, test13) those thresholds proved more
conservative than their budget (FPR 0.005-0.015, recall 0.81-0.87: docs/benchmarks.md, round h18v). This tool keeps
the candidate's encoder and head and chooses the four thresholds (long, other language, corrected, plain) on the
``--dev`` splits instead: every prompt of each split, its evasion variants and its translations is judged as the filter
judges it (normalisation, speller, segments, rules, the logistic head), and the thresholds are
``prompt_filter_cv.condition_thresholds`` over those scores (the same coordinate descent as the CV: every set type's
FPR, pooled over the dev splits, <= the budget). The set types are the CV's: English, misspelt, spaced, buried,
translated (leet and homoglyph normalise back to the English prompt and are reported, not fitted).

``--cross B ...``: for each budget, fit on each dev split alone and apply to the others (recall / FPR per set type):
chooses the budget on the dev splits only. ``--max-fpr B --out DIR``: write the candidate with the thresholds fitted on
all dev splits (policy.json, its fitted state with the new digest, the encoder weights), then check that the filter
loaded from DIR decides every dev prompt as the scores say.

Only for a logistic head without similarity gates (``min_similarity`` <= -1, no ``long_min_similarity`` or
``safe_margin``: then a prompt is blocked iff a rule matches or its highest P(unsafe) over its scored segments reaches
its condition's threshold). The last line printed is a JSON object.

Usage (round h18x):
  GPUFLEET_TUNED_ENCODER=/tmp/h18v/cand/use_tuned.npz .venv/bin/python benchmarks/prompt_filter_refit.py \
      --policy /tmp/h18v/cand/policy.json --dev test12 test13 --cross 0.025 0.03 0.035 0.04
  GPUFLEET_TUNED_ENCODER=/tmp/h18v/cand/use_tuned.npz .venv/bin/python benchmarks/prompt_filter_refit.py \
      --policy /tmp/h18v/cand/policy.json --dev test12 test13 --max-fpr 0.03 --version 2026-12-05.1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prompt_filter_cv import CONDITIONS, condition_thresholds  # noqa: E402

from gpufleet.safety import calibrate, fitted  # noqa: E402
from gpufleet.safety.evaluation import LabelledPrompt, read_labelled  # noqa: E402
from gpufleet.safety.evasion import variants  # noqa: E402
from gpufleet.safety.policy import default_policy  # noqa: E402
from gpufleet.safety.prompt_filter import PromptFilter  # noqa: E402

DATA = ROOT / "tests" / "data" / "prompts"
#: the set types scored (the CV's KINDS plus the two that normalise back to English)
SET_TYPES = ("en", "misspelt", "leet", "spaced", "homoglyph", "buried", "translated")


@dataclass(frozen=True)
class Judged:
    """Every prompt of the scored sets, as arrays: its split, set type, label (0 safe, else category index + 1),
    condition index (into ``CONDITIONS``) and blocking score."""

    split: np.ndarray
    kind: np.ndarray
    label: np.ndarray
    cond: np.ndarray
    score: np.ndarray
    prompts: tuple[str, ...]


def check_ungated(pf: PromptFilter) -> None:
    try:
        pf.blocking_scores([])
    except ValueError as err:
        raise SystemExit(str(err))


def blocking_scores(pf: PromptFilter, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(condition index into ``CONDITIONS``, score) per prompt (:meth:`PromptFilter.blocking_scores`)."""
    conds, scores = pf.blocking_scores(prompts)
    return np.array([CONDITIONS.index(c or "plain") for c in conds]), scores


def split_sets(split: str) -> dict[str, list[LabelledPrompt]]:
    rows = read_labelled(DATA / f"{split}.tsv")
    sets = {"en": rows, **variants(rows)}
    sets["translated"] = read_labelled(DATA / f"translations{split.removeprefix('test')}.tsv")
    return sets


def judge(pf: PromptFilter, splits: list[str]) -> Judged:
    cats = [c.name for c in pf.policy.categories]
    cols: dict[str, list] = {k: [] for k in ("split", "kind", "label", "prompts")}
    conds, scores = [], []
    for split in splits:
        for kind, rows in split_sets(split).items():
            c, s = blocking_scores(pf, [r.prompt for r in rows])
            conds.append(c)
            scores.append(s)
            cols["split"] += [split] * len(rows)
            cols["kind"] += [kind] * len(rows)
            cols["label"] += [0 if r.label == "safe" else cats.index(r.category) + 1 for r in rows]
            cols["prompts"] += [r.prompt for r in rows]
    return Judged(
        np.array(cols["split"]),
        np.array(cols["kind"]),
        np.array(cols["label"]),
        np.concatenate(conds),
        np.concatenate(scores),
        tuple(cols["prompts"]),
    )


def fit(j: Judged, mask: np.ndarray, max_fpr: float) -> dict[str, float]:
    """The CV's fit (:func:`gpufleet.safety.calibrate.condition_thresholds` over the CV's set types)."""
    return condition_thresholds(j.score, j.label, j.kind, j.cond, mask, max_fpr)


def blocked(j: Judged, th: dict[str, float]) -> np.ndarray:
    return calibrate.blocked(j.score, j.cond, CONDITIONS, th)


def figures(j: Judged, th: dict[str, float], mask: np.ndarray, cats: list[str]) -> dict:
    """Per set type over the rows in ``mask``: recall, FPR and the lowest category's recall."""
    b = blocked(j, th)
    unsafe = j.label > 0
    out = {}
    for k in SET_TYPES:
        m = mask & (j.kind == k)
        if not m.any():
            continue
        per_cat = {
            c: float(b[m & (j.label == i + 1)].mean()) for i, c in enumerate(cats) if (m & (j.label == i + 1)).any()
        }
        low = min(per_cat, key=per_cat.get)
        out[k] = {
            "recall": round(float(b[m & unsafe].mean()), 3),
            "fpr": round(float(b[m & ~unsafe].mean()), 3),
            "lowest": [low, round(per_cat[low], 3)],
        }
    return out


def cross(j: Judged, budgets: list[float], cats: list[str]) -> dict:
    splits = sorted(set(j.split.tolist()))
    out = {}
    for b in budgets:
        runs = {}
        for s in splits:
            th = fit(j, j.split == s, b)
            runs[f"fit {s}"] = {"thresholds": th, "applied": figures(j, th, j.split != s, cats)}
        worst = max(v["fpr"] for r in runs.values() for v in r["applied"].values())
        runs["worst_fpr"] = worst
        out[str(b)] = runs
    return out


def loso(j: Judged, budgets: list[float], cats: list[str]) -> dict:
    """For each budget, each dev split in turn judged with thresholds fitted on the others (leave one split out)."""
    splits = sorted(set(j.split.tolist()))
    out = {}
    for b in budgets:
        runs = {s: figures(j, fit(j, j.split != s, b), j.split == s, cats) for s in splits}
        runs["worst_fpr"] = max(v["fpr"] for r in runs.values() for v in r.values())
        out[str(b)] = runs
    return out


def write_candidate(pf: PromptFilter, policy_path: Path, th: dict[str, float], version: str, out: Path) -> Path:
    """DIR/policy.json with the thresholds (plain: the head's threshold), its fitted state re-digested, and the
    encoder weights the candidate was built with."""
    spec = pf.policy.logistic
    assert spec is not None
    logistic = spec.model_copy(
        update={"threshold": th["plain"], "condition_thresholds": {c: th[c] for c in CONDITIONS if c != "plain"}}
    )
    policy = pf.policy.model_copy(update={"version": version, "logistic": logistic})
    out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(policy_path.read_text(encoding="utf-8"))
    doc["version"] = version
    doc["logistic"] = json.loads(logistic.model_dump_json())
    doc["window_words"], doc["stride_words"] = policy.window_words, policy.stride_words
    target = out / "policy.json"
    target.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    pf.save_fitted(fitted.fitted_path(target), policy)  # the same embeddings and head, the new policy's digest
    weights = policy_path.with_name("use_tuned.npz")
    if weights.is_file():
        shutil.copyfile(weights, out / "use_tuned.npz")
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, required=True, help="the built candidate's policy JSON")
    ap.add_argument("--dev", nargs="+", required=True, help="seen held-out splits (test12 test13 ...)")
    ap.add_argument("--cross", type=float, nargs="*", default=[], help="budgets to cross-check between dev splits")
    ap.add_argument("--loso", type=float, nargs="*", default=[], help="budgets to check leaving one dev split out")
    ap.add_argument(
        "--window",
        type=int,
        nargs=2,
        default=None,
        metavar=("WORDS", "STRIDE"),
        help="judge with these window words / stride instead of the policy's (written into the candidate)",
    )
    ap.add_argument("--max-fpr", type=float, default=None, help="the budget of the written candidate")
    ap.add_argument("--version", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.max_fpr is not None and (args.out is None or args.version is None):
        ap.error("--max-fpr needs --out and --version")

    pf = PromptFilter(default_policy(str(args.policy)), policy_path=str(args.policy))
    if args.window:  # the same encoder, embeddings and head; the prompts cut into other windows
        pf.policy = pf.policy.model_copy(update={"window_words": args.window[0], "stride_words": args.window[1]})
    check_ungated(pf)
    cats = [c.name for c in pf.policy.categories]
    j = judge(pf, args.dev)
    result: dict = {"policy": pf.policy.version, "dev": args.dev, "rows": len(j.score)}
    if args.cross:
        result["cross"] = cross(j, args.cross, cats)
        for b, runs in result["cross"].items():
            print(f"budget {b}: worst cross FPR {runs['worst_fpr']}")
            for name, r in runs.items():
                if name != "worst_fpr":
                    print(f"  {name}: {r['thresholds']}")
                    for k, v in r["applied"].items():
                        print(f"    {k:10s} recall {v['recall']:.3f} FPR {v['fpr']:.3f} lowest {v['lowest']}")
    if args.loso:
        result["loso"] = loso(j, args.loso, cats)
        for b, runs in result["loso"].items():
            print(f"budget {b} (leave one split out): worst FPR {runs['worst_fpr']}")
            for k in SET_TYPES:
                per = [r[k] for name, r in runs.items() if name != "worst_fpr" and k in r]
                if per:
                    print(
                        f"    {k:10s} recall {np.mean([v['recall'] for v in per]):.3f} "
                        f"FPR {np.mean([v['fpr'] for v in per]):.3f} (worst {max(v['fpr'] for v in per):.3f})"
                    )
    if args.max_fpr is not None:
        everything = np.ones(len(j.score), bool)
        th = fit(j, everything, args.max_fpr)
        target = write_candidate(pf, args.policy, th, args.version, args.out)
        reloaded = PromptFilter(default_policy(str(target)), policy_path=str(target))
        decided = np.array([not d.allowed for d in reloaded.check_many(list(j.prompts))])
        mismatches = int((decided != blocked(j, th)).sum())
        result.update(
            thresholds=th, dev_figures=figures(j, th, everything, cats), written=str(target), mismatches=mismatches
        )
        print(f"thresholds at {args.max_fpr}: {th}; reloaded filter disagrees with the scores on {mismatches} prompts")
        for k, v in result["dev_figures"].items():
            print(f"  dev {k:10s} recall {v['recall']:.3f} FPR {v['fpr']:.3f} lowest {v['lowest']}")
        if mismatches:
            print(json.dumps(result))
            return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
