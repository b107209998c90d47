"""Choose the tier-1 policy's fitting files and head settings without the held-out split (test3).

Each candidate (a list of labelled files the exemplars come from, and head settings) is fitted in memory and its
best operating point found by the threshold / similarity-floor sweep of ``benchmarks/prompt_filter.py --tune`` on
selection sets that none of its fitting files contain: dev (+ its misspelt, spaced and buried variants, + its
translations)
and, for candidates not fitted on test2, test2 (+ variants, + translations2). The leet and homoglyph variants are
left out of the sweep (the filter folds them before scoring); the buried one is in: at a low threshold a window
of the benign paragraph itself can block, which judging the prompt by its own window does not prevent.

Usage:
  .venv/bin/python benchmarks/prompt_filter_select.py                   # every candidate below
  .venv/bin/python benchmarks/prompt_filter_select.py --only all+tr      # one
The last line printed is a JSON object: per candidate, the best point and the selection sets used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from prompt_filter import DATA, policy_doc, tune  # noqa: E402

from gpufleet.safety.evaluation import read_labelled  # noqa: E402
from gpufleet.safety.evasion import variants  # noqa: E402
from gpufleet.safety.policy import Policy  # noqa: E402
from gpufleet.safety.prompt_filter import PromptFilter  # noqa: E402

TR = ("translations.tsv", "train_translations.tsv")
CANDIDATES: dict[str, tuple[tuple[str, ...], dict]] = {
    "train": (("train.tsv",), {}),
    "train+test": (("train.tsv", "test.tsv"), {}),
    "train+test+tr": (("train.tsv", "test.tsv", *TR), {}),
    "all": (("train.tsv", "test.tsv", "test2.tsv"), {}),
    "all+tr": (("train.tsv", "test.tsv", "test2.tsv", *TR, "translations2.tsv"), {}),
    "train+test+tr l2=0.003": (("train.tsv", "test.tsv", *TR), {"l2": 0.003}),
    "train+test+tr l2=0.03": (("train.tsv", "test.tsv", *TR), {"l2": 0.03}),
    "train+test+tr scale=20": (("train.tsv", "test.tsv", *TR), {"scale": 20.0}),
    "train+test+tr scale=5": (("train.tsv", "test.tsv", *TR), {"scale": 5.0}),
    "train+test+tr it=1500": (("train.tsv", "test.tsv", *TR), {"iterations": 1500}),
}


def cached(encoder):
    """The encoder with its ``encode`` memoised per text (candidates share exemplars and selection segments)."""
    import numpy as np

    memo: dict[str, np.ndarray] = {}
    plain = encoder.encode

    def encode(texts):
        texts = list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in memo))
        if missing:
            memo.update(zip(missing, plain(missing), strict=True))
        return np.stack([memo[t] for t in texts]) if texts else plain(texts)

    encoder.encode = encode
    return encoder


def selection_sets(fit_files: tuple[str, ...]) -> dict:
    sets = {}
    for split, tr in (("dev", "dev_translations.tsv"), ("test2", "translations2.tsv")):
        if f"{split}.tsv" in fit_files:
            continue
        rows = read_labelled(DATA / f"{split}.tsv")
        sets[split] = rows
        for k, v in variants(rows, ["misspelt", "spaced", "buried"]).items():
            sets[f"{split}_{k}"] = v
        if tr not in fit_files:
            sets[f"{split}_translated"] = read_labelled(DATA / tr)
    return sets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="candidate names")
    ap.add_argument("--max-fpr", type=float, default=0.05)
    ap.add_argument("--head", default="{}", help="JSON: logistic settings overriding the policy's, for every run")
    args = ap.parse_args()
    out = {}
    from gpufleet.safety.encoder import encoder_for

    encoder = cached(encoder_for("use-multilingual-v3"))
    for name, (files, head) in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        t = time.monotonic()
        doc = policy_doc(files)
        doc["logistic"].update(head | json.loads(args.head))
        pf = PromptFilter(Policy.model_validate(doc), encoder=encoder, use_fitted=False)
        fit_s = time.monotonic() - t
        sets = selection_sets(files)
        best = tune(pf, sets, args.max_fpr)
        out[name] = {"files": list(files), "sets": list(sets), "best": best, "fit_s": round(fit_s, 1)}
        print(name, json.dumps(out[name]), f"{time.monotonic() - t:.0f} s", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
