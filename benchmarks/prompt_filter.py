"""Benchmark: the tier-1 prompt filter on the labelled set, its evasion variants and its translations.

Set: ``tests/data/prompts/`` (written for gpufleet): ``train.tsv`` (the policy's
exemplars and safe anchors: the logistic head is fitted on them), ``dev.tsv``
and ``dev_translations.tsv`` (the threshold is chosen on them and the dev variants: ``--tune``),
``test.tsv`` (figures are reported on it only) and ``translations.tsv`` (test prompts written in es, fr,
de, pt); ``train_translations.tsv`` adds es/fr/de/pt exemplars to the train split.
Evasion variants (:mod:`gpufleet.safety.evasion`: misspelt, leet, spaced,
homoglyph + zero-width, buried after 200+ benign words) are generated from the
split being measured.

Usage:
  .venv/bin/python benchmarks/prompt_filter.py                 # test split, variants, translations
  .venv/bin/python benchmarks/prompt_filter.py --split dev --tune  # threshold sweep on dev
  .venv/bin/python benchmarks/prompt_filter.py --write-variants out/  # the variant sets as TSV files
  .venv/bin/python benchmarks/prompt_filter.py --rebuild-policy VERSION  # exemplars := the train files
``--rebuild-policy`` rewrites the packaged policy's category exemplars and safe anchors from ``train.tsv``
(``--train-translations``: and ``train_translations.tsv``; nothing else of the policy changes but its version)
and saves its fitted state.
The last line printed is a JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufleet.safety.evaluation import error_lines, evaluate, format_table, read_labelled  # noqa: E402
from gpufleet.safety.evasion import variants  # noqa: E402
from gpufleet.safety.policy import default_policy  # noqa: E402
from gpufleet.safety.prompt_filter import PromptFilter  # noqa: E402

DATA = ROOT / "tests" / "data" / "prompts"


def _write(path: Path, rows) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write("lang\tlabel\tcategory\tprompt\n")
        for r in rows:
            f.write(f"{r.lang}\t{r.label}\t{r.category}\t{r.prompt}\n")


def tune(pf: PromptFilter, sets: dict, max_fpr: float) -> dict:
    """Sweep the logistic head's threshold and similarity floor over these sets (the split and its variants):
    the highest recall over all of them with every set's FPR <= max_fpr (ties: the stricter point)."""
    import numpy as np

    table = []  # per set: (labels, per-row list of (P(unsafe), nearest sim of the predicted category))
    for rows in sets.values():
        segs = [pf.scored_segments(r.prompt)[1] for r in rows]
        unique = list(dict.fromkeys(s for sg in segs for s in sg))
        index = {s: i for i, s in enumerate(unique)}
        vectors = pf.encoder.encode(unique)
        cats, safe = pf._score_matrix(vectors)
        nearest = pf._nearest(vectors)
        best_cat = np.argmax(cats, axis=1)
        near = nearest[np.arange(len(unique)), best_cat]
        table.append(([r.label for r in rows], [[(1 - safe[index[s]], near[index[s]]) for s in sg] for sg in segs]))
    best = None
    for thr in np.round(np.arange(0.30, 0.96, 0.02), 2):
        for floor in np.round(np.arange(0.0, 0.61, 0.05), 2):
            tp = nu = 0
            worst_fpr = 0.0
            for labels, rows in table:
                blocked = [any(u >= thr and s >= floor for u, s in segs) for segs in rows]
                fp = sum(b for b, lab in zip(blocked, labels, strict=True) if lab == "safe")
                ns = sum(lab == "safe" for lab in labels)
                tp += sum(b for b, lab in zip(blocked, labels, strict=True) if lab == "unsafe")
                nu += len(labels) - ns
                worst_fpr = max(worst_fpr, fp / ns if ns else 0.0)
            point = {
                "threshold": float(thr),
                "min_similarity": float(floor),
                "recall": round(tp / nu, 4),
                "worst_fpr": round(worst_fpr, 4),
            }
            if worst_fpr <= max_fpr and (best is None or point["recall"] >= best["recall"]):
                best = point
    return best or {}


def rebuild_policy(version: str, with_translations: bool = False) -> int:
    """Set the packaged policy's exemplars and safe anchors to the train split's rows (grouped by category, in
    file order; ``with_translations``: and ``train_translations.tsv``'s) and write its fitted state."""
    from gpufleet.safety import fitted
    from gpufleet.safety.policy import DEFAULT_POLICY_PATH, Policy

    doc = json.loads(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    rows = read_labelled(DATA / "train.tsv")
    if with_translations:
        rows += read_labelled(DATA / "train_translations.tsv")
    by_cat: dict[str, list[str]] = {c["name"]: [] for c in doc["categories"]}
    for r in rows:
        if r.label == "unsafe":
            by_cat[r.category].append(r.prompt)
    for c in doc["categories"]:
        c["exemplars"] = list(dict.fromkeys(by_cat[c["name"]]))
    doc["safe_exemplars"] = list(dict.fromkeys(r.prompt for r in rows if r.label == "safe"))
    doc["version"] = version
    policy = Policy.model_validate(doc)
    DEFAULT_POLICY_PATH.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    PromptFilter(policy, use_fitted=False).save_fitted(fitted.fitted_path(None))
    print(
        json.dumps(
            {
                "policy": version,
                "exemplars": {k: len(v) for k, v in by_cat.items()},
                "safe_anchors": len(doc["safe_exemplars"]),
            }
        )
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test", choices=["train", "dev", "test", "test2"])
    ap.add_argument("--policy", default=None, help="policy JSON (default: the packaged one)")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="sweep the logistic head's threshold and similarity floor on the split and its variants",
    )
    ap.add_argument("--max-fpr", type=float, default=0.03, help="--tune: the false-positive budget")
    ap.add_argument("--write-variants", type=Path, default=None, help="write the variant sets as TSV here")
    ap.add_argument(
        "--record",
        type=Path,
        default=None,
        help="write every set's figures (Evaluation.as_dict) here: the floors the tests hold",
    )
    ap.add_argument("--rebuild-policy", metavar="VERSION", help="exemplars from the train split, then exit")
    ap.add_argument(
        "--train-translations",
        action="store_true",
        help="--rebuild-policy: add train_translations.tsv (lowered dev recall: docs/benchmarks.md)",
    )
    ap.add_argument("--no-rules", action="store_true", help="embedding scorer only (ablation)")
    args = ap.parse_args()

    t0 = time.monotonic()
    if args.rebuild_policy:
        return rebuild_policy(args.rebuild_policy, args.train_translations)
    policy = default_policy(args.policy)
    if args.no_rules:
        policy = policy.model_copy(update={"rules": []})
    pf = PromptFilter(policy)
    build_s = time.monotonic() - t0
    rows = read_labelled(DATA / f"{args.split}.tsv")
    translations = {"test": "translations.tsv", "dev": "dev_translations.tsv", "test2": "translations2.tsv"}
    if args.tune:
        sets = {args.split: rows, **variants(rows)}
        if args.split in translations:
            sets["translated"] = read_labelled(DATA / translations[args.split])
        best = tune(pf, sets, args.max_fpr)
        print(json.dumps({"split": args.split, "policy": policy.version, "max_fpr": args.max_fpr, "best": best}))
        return 0
    sets = {args.split: rows, **variants(rows)}
    if args.split in translations:
        sets["translated"] = read_labelled(DATA / translations[args.split])
    if args.write_variants:
        args.write_variants.mkdir(parents=True, exist_ok=True)
        for name, rs in sets.items():
            _write(args.write_variants / f"{name}.tsv", rs)
    recorded: dict = {"policy": policy.version, "sets": {}}
    summary: dict = {"policy": policy.version, "encoder": pf.encoder.name, "build_s": round(build_s, 2), "sets": {}}
    for name, rs in sets.items():
        t = time.monotonic()
        ev = evaluate(rs, pf.check_many([r.prompt for r in rs]))
        took = time.monotonic() - t
        print(f"== {name} ({len(rs)} prompts, {took:.1f} s)")
        print("\n".join([format_table(ev), *error_lines(ev, "   ", 100)]))
        d = ev.as_dict()
        recorded["sets"][name] = {k: d[k] for k in ("overall", "categories")}
        summary["sets"][name] = {
            "recall": d["overall"]["recall"],
            "fpr": d["overall"]["fpr"],
            "min_category_recall": min(v["recall"] for v in d["categories"].values()),
            "per_category": {c: v["recall"] for c, v in d["categories"].items()},
        }
        if name == "translated":
            for lang in sorted({r.lang for r in rs}):
                sub = [i for i, r in enumerate(rs) if r.lang == lang]
                le = evaluate([rs[i] for i in sub], pf.check_many([rs[i].prompt for i in sub]))
                summary["sets"][f"translated_{lang}"] = {"recall": round(le.recall, 4), "fpr": round(le.fpr, 4)}
                print(f"   {lang}: recall {le.recall:.3f}, FPR {le.fpr:.3f}")
    if args.record:
        args.record.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
