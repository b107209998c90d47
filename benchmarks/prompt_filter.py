"""Benchmark: the tier-1 prompt filter on the labelled set, its evasion variants and its translations.

Set: ``tests/data/prompts/`` (written for gpufleet). The policy's exemplars and safe anchors (the logistic head is
fitted on them) come from ``FIT_FILES``: every seen English split (train, dev, test, test2 ... test5) and train2, with
the segments of ``SCENE_FILES`` as safe anchors; its operating point was chosen by ``benchmarks/prompt_filter_cv.py``
(cross-validation over those splits). ``test6.tsv`` / ``translations6.tsv`` (test6 prompts written in es, fr, de,
pt), ``test7`` and ``test8`` (with ``translations7`` / ``translations8``) are the latest splits figures are reported on
(test6 measured once with policy ``2026-12-03.5``; test7 and test8 each once with a candidate ``2026-12-03.6``, neither
shipped, and then with ``.5``: docs/benchmarks.md); all are now seen, so the next policy needs a fresh split written
before it.
Evasion variants (:mod:`gpufleet.safety.evasion`: misspelt, leet, spaced,
homoglyph + zero-width, buried after 200+ benign words, one of seven paragraphs) are generated from the
split being measured.

Usage:
  .venv/bin/python benchmarks/prompt_filter.py --split test8   # the latest measured split, variants, translations
  .venv/bin/python benchmarks/prompt_filter.py --split dev --tune  # threshold sweep on dev
  .venv/bin/python benchmarks/prompt_filter.py --write-variants out/  # the variant sets as TSV files
  .venv/bin/python benchmarks/prompt_filter.py --rebuild-policy VERSION  # exemplars := the train files
``--rebuild-policy`` rewrites the packaged policy's category exemplars and safe anchors from the ``--fit`` files
(default ``FIT_FILES``; nothing else of the policy changes but its version) and saves its fitted state.
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


def tune(pf: PromptFilter, sets: dict, max_fpr: float, grid: tuple | None = None) -> dict:
    """Sweep the logistic head's threshold, similarity floor and ``safe_margin`` over these sets (a split, its
    variants, its translations): the highest recall over all of them with every set's FPR <= max_fpr (ties: the
    first point; rules included: a prompt a rule blocks is blocked at every point). ``safe_margin``: the blocking
    segment's nearest exemplar of its category at least this much more similar than its nearest safe anchor (None:
    no such test). The best point carries its per-set (recall, FPR). ``grid``: (thresholds, floors, margins) to
    sweep instead of the default ones."""
    import numpy as np

    table = []
    for name, rows in sets.items():
        pairs = [pf.scored_segments(r.prompt) for r in rows]
        ruled = [any(rule.matches(c) for rule in pf.policy.rules for c in sg.clauses) for sg, _ in pairs]
        unique = list(dict.fromkeys(s for _, sg in pairs for s in sg))
        index = {s: i for i, s in enumerate(unique)}
        vectors = pf.encoder.encode(unique)
        cats, safe = pf._score_matrix(vectors, unique)
        nearest = pf._nearest(vectors)
        near = nearest[np.arange(len(unique)), np.argmax(cats, axis=1)]
        near_safe = (vectors @ pf._safe.T).max(axis=1)
        flat = np.array([index[s] for _, sg in pairs for s in sg])
        starts = np.cumsum([0] + [len(sg) for _, sg in pairs[:-1]])
        unsafe = np.array([r.label == "unsafe" for r in rows])
        table.append((name, unsafe, np.array(ruled), (1 - safe)[flat], near[flat], (near - near_safe)[flat], starts))
    best = None
    thresholds, floors, margins = grid or (
        np.round(np.arange(0.10, 0.96, 0.02), 2),
        np.round(np.arange(0.0, 0.76, 0.05), 2),
        (None, -0.05, 0.0, 0.02, 0.04, 0.06, 0.08, 0.1),
    )
    for thr in thresholds:
        for floor in floors:
            for margin in margins:
                tp = nu = 0
                worst = 0.0
                per = {}
                for name, unsafe, ruled, pu, near, gap, starts in table:
                    ok = (pu >= thr) & (near >= floor)
                    if margin is not None:
                        ok &= gap >= margin
                    blocked = ruled | np.maximum.reduceat(ok, starts)
                    fpr = float(blocked[~unsafe].mean()) if (~unsafe).any() else 0.0
                    rec = float(blocked[unsafe].mean())
                    tp += int(blocked[unsafe].sum())
                    nu += int(unsafe.sum())
                    worst = max(worst, fpr)
                    per[name] = (round(rec, 3), round(fpr, 3))
                point = {
                    "threshold": float(thr),
                    "min_similarity": float(floor),
                    "safe_margin": margin,
                    "recall": round(tp / nu, 4),
                    "worst_fpr": round(worst, 4),
                    "per_set": per,
                }
                if worst <= max_fpr and (best is None or point["recall"] > best["recall"]):
                    best = point
    return best or {}


#: the labelled files the packaged policy's exemplars and safe anchors come from (``--rebuild-policy``): from policy
#: ``2026-12-03.1`` on every seen English split (train, dev and the test splits already measured: from
#: ``2026-12-03.3`` test4 too; from ``2026-12-03.5`` test5 and the training-only train2). The es/fr/de/pt translations
#: stay out: in the cross-validation over the seen splits (``benchmarks/prompt_filter_cv.py``) fitting on them too
#: lowered pooled recall (0.832 against 0.841; with train2's translations, 2026-12-03: 0.840 against 0.876)
FIT_FILES = ("train.tsv", "dev.tsv", "test.tsv", "test2.tsv", "test3.tsv", "test4.tsv", "test5.tsv", "train2.tsv")
#: training-only long benign scene descriptions (``--rebuild-policy``): every clause and window of each row, as the
#: filter cuts it, is a safe anchor (from policy ``2026-12-03.5``; chosen by the cross-validation with the buried
#: variant, docs/benchmarks.md)
SCENE_FILES = ("train_scenes.tsv",)


def policy_doc(
    files: tuple[str, ...] = FIT_FILES, version: str | None = None, scenes: tuple[str, ...] = SCENE_FILES
) -> dict:
    """The packaged policy's JSON with its category exemplars and safe anchors set to the rows of ``files`` (names
    in tests/data/prompts; grouped by category, in file order, duplicates dropped) and the segments of the
    ``scenes`` rows (safe anchors), and ``version`` if given."""
    from gpufleet.safety.normalize import normalize
    from gpufleet.safety.policy import DEFAULT_POLICY_PATH
    from gpufleet.safety.segments import segment

    doc = json.loads(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    rows = [r for f in files for r in read_labelled(DATA / f)]
    by_cat: dict[str, list[str]] = {c["name"]: [] for c in doc["categories"]}
    for r in rows:
        if r.label == "unsafe":
            by_cat[r.category].append(r.prompt)
    for c in doc["categories"]:
        c["exemplars"] = list(dict.fromkeys(by_cat[c["name"]]))
    safe = [r.prompt for r in rows if r.label == "safe"]
    for f in scenes:
        for r in read_labelled(DATA / f):
            safe += segment(normalize(r.prompt), doc.get("window_words", 32), doc.get("stride_words", 16)).all()
    doc["safe_exemplars"] = list(dict.fromkeys(safe))
    if version:
        doc["version"] = version
    return doc


def rebuild_policy(version: str, files: tuple[str, ...] = FIT_FILES) -> int:
    """Set the packaged policy's exemplars and safe anchors to the rows of ``files`` and write its fitted state."""
    from gpufleet.safety import fitted
    from gpufleet.safety.policy import DEFAULT_POLICY_PATH, Policy

    doc = policy_doc(files, version)
    policy = Policy.model_validate(doc)
    DEFAULT_POLICY_PATH.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    t = time.monotonic()
    PromptFilter(policy, use_fitted=False).save_fitted(fitted.fitted_path(None))
    print(
        json.dumps(
            {
                "policy": version,
                "files": list(files),
                "exemplars": {c["name"]: len(c["exemplars"]) for c in doc["categories"]},
                "safe_anchors": len(doc["safe_exemplars"]),
                "fit_s": round(time.monotonic() - t, 1),
            }
        )
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--split",
        default="test8",
        choices=["train", "dev", *sorted((f.stem for f in DATA.glob("test*.tsv")), key=lambda n: int(n[4:] or 1))],
    )
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
    ap.add_argument("--rebuild-policy", metavar="VERSION", help="exemplars from the --fit files, then exit")
    ap.add_argument(
        "--fit",
        nargs="+",
        default=list(FIT_FILES),
        metavar="FILE",
        help="--rebuild-policy: the labelled files (in tests/data/prompts) the exemplars come from",
    )
    ap.add_argument("--no-rules", action="store_true", help="embedding scorer only (ablation)")
    args = ap.parse_args()

    t0 = time.monotonic()
    if args.rebuild_policy:
        return rebuild_policy(args.rebuild_policy, tuple(args.fit))
    policy = default_policy(args.policy)
    if args.no_rules:
        policy = policy.model_copy(update={"rules": []})
    pf = PromptFilter(policy, policy_path=args.policy)  # its saved fitted state, when one lies beside it
    build_s = time.monotonic() - t0
    rows = read_labelled(DATA / f"{args.split}.tsv")
    translations = {
        "test": "translations.tsv",
        "dev": "dev_translations.tsv",
        "test2": "translations2.tsv",
        "test3": "translations3.tsv",
        "test4": "translations4.tsv",
        "test5": "translations5.tsv",
        "test6": "translations6.tsv",
        "test7": "translations7.tsv",
        "test8": "translations8.tsv",
        "test9": "translations9.tsv",
        "test10": "translations10.tsv",
        "test11": "translations11.tsv",
        "test12": "translations12.tsv",
        "test13": "translations13.tsv",
        "test14": "translations14.tsv",
        "test15": "translations15.tsv",
        "test16": "translations16.tsv",
        "test17": "translations17.tsv",
        "test18": "translations18.tsv",
        "test19": "translations19.tsv",
        "test20": "translations20.tsv",
        "test21": "translations21.tsv",
        "test22": "translations22.tsv",
        "test23": "translations23.tsv",
        "test24": "translations24.tsv",
        "test25": "translations25.tsv",
        "test26": "translations26.tsv",
        "test27": "translations27.tsv",
        "test28": "translations28.tsv",
        "test29": "translations29.tsv",
        "test30": "translations30.tsv",
        "test31": "translations31.tsv",
    }
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
        decisions = pf.check_many([r.prompt for r in rs])
        ev = evaluate(rs, decisions)
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
        if name == "translated":  # each language's counts too (recorded, so records can be summed per language)
            for lang in sorted({r.lang for r in rs}):
                sub = [i for i, r in enumerate(rs) if r.lang == lang]
                le = evaluate([rs[i] for i in sub], [decisions[i] for i in sub])
                ld = le.as_dict()
                recorded["languages"] = {**recorded.get("languages", {}),
                                         lang: {k: ld[k] for k in ("overall", "categories")}}
                summary["sets"][f"translated_{lang}"] = {"recall": round(le.recall, 4), "fpr": round(le.fpr, 4)}
                print(f"   {lang}: recall {le.recall:.3f}, FPR {le.fpr:.3f}")
    if args.record:
        args.record.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
