r"""Compare tier-1 scoring methods by cross-validation over the seen prompt splits only (never a held-out one).

Folds are the seen splits (train, dev, test, test2 ... test8), each with its es/fr/de/pt
translations (train_translations, dev_translations, translations, translations2 ... translations8). For each fold a method is
fitted on the other folds (English rows, their misspelt and spaced variants, and - where the method says so -
their translations; with ``--extra EN TR`` and an n-gram spec ending ``:x`` / ``:xt`` also those training-only rows
in every fold, never scored) and scores the held-out fold's rows, misspelt, spaced and buried variants (every
English row after the benign paragraph :func:`gpufleet.safety.evasion.buried` picks for it, one of seven) and translations, every prompt
prepared as the filter prepares it (normalised, spelling corrected, cut into clauses and windows: a prompt's score
is its highest segment's). The out-of-fold scores of all folds are then pooled and each method's operating point
is the lowest threshold at which every pooled set type (English, misspelt, spaced, translated, buried) keeps
FPR <= --max-fpr; recall there, overall, per set type and its lowest category, is what the methods are compared on
(``--per-category``: thresholds per category, nested: chosen on the other folds' scores, applied to each).

Usage:
  .venv/bin/python benchmarks/prompt_filter_cv.py                 # every method
  .venv/bin/python benchmarks/prompt_filter_cv.py --only softmax+tr
  .venv/bin/python benchmarks/prompt_filter_cv.py --only none --cache /tmp/cv7.npz \
      --extra train2.tsv train2_translations.tsv --ngrams 0:10:0.01 0:10:0.01:x --floors 0.4 --per-category
  .venv/bin/python benchmarks/prompt_filter_cv.py --only none --cache /tmp/cv9t3.npz --extra train2.tsv \
      train2_translations.tsv --extra-en train3.tsv --ngrams 0:10:0.01:x --floors 0.4 --long-floors 0.5 \
      --scenes train_scenes.tsv
  .venv/bin/python benchmarks/prompt_filter_cv.py --only none --cache /tmp/eo.npz --reuse-cache /tmp/t3.npz \
      --spelling-english-only --extra train2.tsv train2_translations.tsv --extra-en train3.tsv \
      [--extra-tr train4_translations.tsv] --ngrams 0:10:0.01:x --floors 0.4 --long-floors 0.5 --scenes train_scenes.tsv
  .venv/bin/python benchmarks/prompt_filter_cv.py --only none --cache /tmp/ec.npz --reuse-cache /tmp/eo.npz \
      --spelling-english-only --spelling-english-candidates --extra train2.tsv train2_translations.tsv \
      --extra-en train3.tsv --ngrams 0:10:0.01:x --floors 0.4 --long-floors 0.5 --scenes train_scenes.tsv --conditions
The last line printed is a JSON object, per method its operating point and figures.
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

from gpufleet.safety import calibrate  # noqa: E402
from gpufleet.safety.evaluation import read_labelled  # noqa: E402
from gpufleet.safety.evasion import BENIGN_PARAGRAPHS, variants  # noqa: E402
from gpufleet.safety.head import fit_softmax  # noqa: E402
from gpufleet.safety.ngrams import hashed_ngrams  # noqa: E402
from gpufleet.safety.prompt_filter import PromptFilter  # noqa: E402

DATA = ROOT / "tests" / "data" / "prompts"
FOLDS = {
    "train": ("train.tsv", "train_translations.tsv"),
    "dev": ("dev.tsv", "dev_translations.tsv"),
    "test": ("test.tsv", "translations.tsv"),
    "test2": ("test2.tsv", "translations2.tsv"),
    "test3": ("test3.tsv", "translations3.tsv"),
    "test4": ("test4.tsv", "translations4.tsv"),
    "test5": ("test5.tsv", "translations5.tsv"),
    "test6": ("test6.tsv", "translations6.tsv"),
    "test7": ("test7.tsv", "translations7.tsv"),
    "test8": ("test8.tsv", "translations8.tsv"),
}
#: ``buried``: every English row after the benign paragraph (:func:`gpufleet.safety.evasion.buried`), scored, never
#: fitted on: its FPR is held to the budget with the others, so a threshold that lets a clause of the paragraph
#: block (policy ``2026-12-03.3`` on test5) is not chosen
KINDS = ("en", "misspelt", "spaced", "translated", "buried")
#: training-only rows (``--extra``): fitted on in every fold where a method asks for them, never scored
EXTRA = "extra"
#: the kind of ``--extra-tr`` rows: training-only translations fitted with ``:x`` and ``:xt`` (unlike ``--extra``'s
#: translations, which only ``:xt`` fits)
EXTRA_TR = "extra_translated"


def load_rows(
    extra: tuple[str, str] | None = None, extra_en: tuple[str, ...] = (), extra_tr: tuple[str, ...] = ()
) -> list[tuple[str, str, object]]:
    """(fold, kind, LabelledPrompt) for every seen row and its variants; ``extra`` (an English file and its
    translations, names in tests/data/prompts), ``extra_en`` (English files without translations) and ``extra_tr``
    (translation files without English rows, kind ``EXTRA_TR``) as fold ``EXTRA``, without a buried variant."""
    out = []
    folds = dict(FOLDS, **({EXTRA: extra} if extra else {}))
    for fold, (en, tr) in folds.items():
        rows = read_labelled(DATA / en)
        out += [(fold, "en", r) for r in rows]
        kinds = ["misspelt", "spaced"] + (["buried"] if fold != EXTRA else [])
        for kind, vs in variants(rows, kinds).items():
            out += [(fold, kind, r) for r in vs]
        out += [(fold, "translated", r) for r in read_labelled(DATA / tr)]
    for en in extra_en:
        rows = read_labelled(DATA / en)
        out += [(EXTRA, "en", r) for r in rows]
        for kind, vs in variants(rows, ["misspelt", "spaced"]).items():
            out += [(EXTRA, kind, r) for r in vs]
    for tr in extra_tr:
        out += [(EXTRA, EXTRA_TR, r) for r in read_labelled(DATA / tr)]
    return out


def segment_texts(pf: PromptFilter, rows) -> tuple[list[str], list[np.ndarray]]:
    """(unique segment texts, per row the indices of its segments)."""
    segs = [pf.scored_segments(r.prompt)[1] for _, _, r in rows]
    unique = list(dict.fromkeys(s for sg in segs for s in sg))
    index = {s: i for i, s in enumerate(unique)}
    return unique, [np.array([index[s] for s in sg]) for sg in segs]


def embed_texts(pf: PromptFilter, texts: list[str]) -> np.ndarray:
    """The encoder's embeddings of ``texts``, in batches."""
    if not texts:
        return np.zeros((0, 512), dtype=np.float32)
    return np.concatenate([pf.encoder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])


def embed(pf: PromptFilter, rows) -> tuple[np.ndarray, list[np.ndarray]]:
    """(unique segment embeddings, per row the indices of its segments)."""
    unique, seg_idx = segment_texts(pf, rows)
    return embed_texts(pf, unique), seg_idx


def softmax_scorer(x, y, cats, *, l2=0.01, scale=10.0, iterations=400, margin=None, safe_x=None, cat_x=None):
    head = fit_softmax(x, y, cats + 1, l2=l2, scale=scale, iterations=iterations, learning_rate=0.5)

    def score(v):
        p = head.probabilities(v)
        s = 1 - p[:, 0]
        if margin is not None:
            best = p[:, 1:].argmax(axis=1)
            near = np.stack([(v @ e.T).max(axis=1) for e in cat_x], axis=1)[np.arange(len(v)), best]
            gap = near - (v @ safe_x.T).max(axis=1)
            s = np.where(gap >= margin, s, 0.0)
        return s

    return score


def softmax_floor_scorers(x, y, cats, floors, *, l2=0.01, scale=10.0, iterations=400):
    """One softmax fit, scored at several similarity floors: a segment counts only when its nearest training
    exemplar of its most probable category is at least that similar (policy ``logistic.min_similarity``)."""
    head = fit_softmax(x, y, cats + 1, l2=l2, scale=scale, iterations=iterations, learning_rate=0.5)
    cat_x = [x[y == i + 1] for i in range(cats)]

    def scores(v):
        p = head.probabilities(v)
        best = p[:, 1:].argmax(axis=1)
        near = np.stack([(v @ e.T).max(axis=1) for e in cat_x], axis=1)[np.arange(len(v)), best]
        return {f: np.where(near >= f, 1 - p[:, 0], 0.0) for f in floors}

    return scores


def ngram_floor_scorers(x, g, y, cats, floors, *, dims_g, ngram_scale, ngram_l2, l2=0.01, scale=10.0, iterations=400):
    """The softmax over the embedding and hashed character n-grams of the segment (one head), scored at several
    similarity floors as :func:`softmax_floor_scorers`."""
    head = fit_softmax(
        x,
        y,
        cats + 1,
        l2=l2,
        scale=scale,
        iterations=iterations,
        learning_rate=0.5,
        grams=g,
        ngram_l2=ngram_l2,
        ngram_scale=ngram_scale,
    )
    cat_x = [x[y == i + 1] for i in range(cats)]

    def scores(v, gv):
        p = head.probabilities(v, gv)
        best = p[:, 1:].argmax(axis=1)
        near = np.stack([(v @ e.T).max(axis=1) for e in cat_x], axis=1)[np.arange(len(v)), best]
        return {f: np.where(near >= f, 1 - p[:, 0], 0.0) for f in floors}, p

    return scores


def binary_scorer(x, y, *, l2=0.01, scale=10.0, iterations=400, balance=True):
    yb = (y > 0).astype(int)
    if balance:  # repeat the minority class so the two weigh the same
        pos, neg = np.flatnonzero(yb == 1), np.flatnonzero(yb == 0)
        small, big = (pos, neg) if len(pos) < len(neg) else (neg, pos)
        extra = np.resize(small, len(big) - len(small))
        idx = np.concatenate([np.arange(len(yb)), extra])
        x, yb = x[idx], yb[idx]
    head = fit_softmax(x, yb, 2, l2=l2, scale=scale, iterations=iterations, learning_rate=0.5)
    return lambda v: head.probabilities(v)[:, 1]


def mlp_scorer(x, y, cats, *, hidden=256, l2=1e-3, epochs=300, lr=0.1, seed=0):
    """One hidden layer (ReLU), softmax over safe + categories, full-batch gradient descent (deterministic)."""
    rng = np.random.default_rng(seed)
    k = cats + 1
    w1 = (rng.standard_normal((x.shape[1], hidden)) * np.sqrt(2 / x.shape[1])).astype(np.float32)
    b1 = np.zeros(hidden, np.float32)
    w2 = (rng.standard_normal((hidden, k)) * np.sqrt(1 / hidden)).astype(np.float32)
    b2 = np.zeros(k, np.float32)
    t = np.eye(k, dtype=np.float32)[y]
    xs = (x * 10).astype(np.float32)
    for _ in range(epochs):
        h = np.maximum(xs @ w1 + b1, 0)
        z = h @ w2 + b2
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        g = (p - t) / len(xs)
        gw2 = h.T @ g + l2 * w2
        gh = (g @ w2.T) * (h > 0)
        gw1 = xs.T @ gh + l2 * w1
        w2 -= lr * gw2
        b2 -= lr * g.sum(0)
        w1 -= lr * gw1
        b1 -= lr * gh.sum(0)

    def score(v):
        h = np.maximum((v * 10) @ w1 + b1, 0)
        z = h @ w2 + b2
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        return 1 - p[:, 0] / p.sum(1)

    return score


def knn_scorer(x, y):
    safe, unsafe = x[y == 0], x[y > 0]
    return lambda v: (v @ unsafe.T).max(axis=1) - (v @ safe.T).max(axis=1)


def operating_point(oof, label, kind, fold, cats, max_fpr) -> dict:
    """The lowest threshold at which every pooled set type keeps FPR <= max_fpr, and the recall there."""
    unsafe = label > 0
    cands = np.unique(np.round(oof, 4))
    best = None
    for thr in cands:
        blocked = oof >= thr
        fprs = {k: float(blocked[(kind == k) & ~unsafe].mean()) for k in KINDS}
        if max(fprs.values()) <= max_fpr:
            best = (thr, blocked, fprs)
            break
    thr, blocked, fprs = best
    res = {"threshold": float(thr), "recall": round(float(blocked[unsafe].mean()), 4), "fpr": fprs}
    res["recall_by_kind"] = {k: round(float(blocked[(kind == k) & unsafe].mean()), 3) for k in KINDS}
    per_cat = {c: round(float(blocked[label == i + 1].mean()), 3) for i, c in enumerate(cats)}
    res["per_category"] = per_cat
    res["min_category"] = min(per_cat.items(), key=lambda kv: kv[1])
    res["per_fold_en"] = {f: round(float(blocked[(fold == f) & (kind == "en") & unsafe].mean()), 3) for f in FOLDS}
    return res


def per_category_thresholds(oof, oof_cat, label, kind, mask, ncat, max_fpr, grid=None):
    """Thresholds per blocking category (coordinate ascent from the best single threshold, two rounds), chosen on
    the rows in ``mask`` so that every set type keeps FPR <= max_fpr there; returns the array of thresholds."""
    grid = np.round(np.arange(0.30, 0.99, 0.01), 2) if grid is None else grid
    unsafe = label > 0

    def ok_and_recall(th):
        blocked = oof >= th[oof_cat]
        for k in KINDS:
            sel = mask & (kind == k) & ~unsafe
            if sel.any() and blocked[sel].mean() > max_fpr:
                return False, 0.0
        return True, float(blocked[mask & unsafe].mean())

    best_t = None
    for t in grid:
        ok, rec = ok_and_recall(np.full(ncat, t))
        if ok:
            best_t = t
            break
    th = np.full(ncat, best_t if best_t is not None else grid[-1])
    _, cur = ok_and_recall(th)
    for _ in range(2):
        for c in range(ncat):
            for t in grid:
                trial = th.copy()
                trial[c] = t
                ok, rec = ok_and_recall(trial)
                if ok and rec > cur + 1e-9:
                    th, cur = trial, rec
    return th


def nested_per_category(oof, oof_cat, label, kind, fold, cats, max_fpr) -> dict:
    """Per-category thresholds judged honestly: for each fold, chosen on the other folds' out-of-fold scores and
    applied to this one; the pooled result, and the thresholds chosen on all folds (what a policy would ship)."""
    blocked = np.zeros(len(oof), dtype=bool)
    for f in FOLDS:
        th = per_category_thresholds(oof, oof_cat, label, kind, fold != f, len(cats), max_fpr)
        held = fold == f
        blocked[held] = oof[held] >= th[oof_cat[held]]
    unsafe = label > 0
    res = {
        "recall": round(float(blocked[unsafe].mean()), 4),
        "fpr": {k: round(float(blocked[(kind == k) & ~unsafe].mean()), 4) for k in KINDS},
        "recall_by_kind": {k: round(float(blocked[(kind == k) & unsafe].mean()), 3) for k in KINDS},
        "per_category": {c: round(float(blocked[label == i + 1].mean()), 3) for i, c in enumerate(cats)},
    }
    res["thresholds_all_folds"] = dict(
        zip(
            cats,
            per_category_thresholds(oof, oof_cat, label, kind, np.ones(len(oof), bool), len(cats), max_fpr)
            .round(2)
            .tolist(),
            strict=True,
        )
    )
    return res


def paragraph_fpr(oof, label, kind, rows, fold, threshold) -> dict[int, float]:
    """The buried set's FPR at ``threshold`` per benign paragraph (index in ``BENIGN_PARAGRAPHS``)."""
    scored_rows = [r for (f, _, r) in rows if f != EXTRA]
    para = np.array(
        [next((i for i, p in enumerate(BENIGN_PARAGRAPHS) if r.prompt.startswith(p)), -1) for r in scored_rows]
    )
    sel = (kind == "buried") & (label == 0)
    return {i: round(float((oof[sel & (para == i)] >= threshold).mean()), 3) for i in range(len(BENIGN_PARAGRAPHS))}


#: the prompt conditions and "plain" (:data:`gpufleet.safety.calibrate.CONDITIONS`)
CONDITIONS = calibrate.CONDITIONS


def condition_thresholds(oof, label, kind, cond, mask, max_fpr) -> dict[str, float]:
    """A threshold per condition, chosen on the rows in ``mask`` alone (:func:`gpufleet.safety.calibrate.
    condition_thresholds`: from their one-threshold operating point, each condition's threshold lowered in turn to the
    lowest value at which every set type of ``KINDS`` keeps FPR <= max_fpr, four rounds over the conditions)."""
    return calibrate.condition_thresholds(oof, label > 0, kind, cond, CONDITIONS, mask, max_fpr, groups=KINDS)


def condition_figures(oof, label, kind, fold, cond, cats, max_fpr) -> dict:
    """Thresholds per prompt condition (``--conditions``): chosen on every fold's scores (``thresholds``, what a
    policy would take) and, for the figures, nested (chosen on the other folds' scores, applied to each)."""
    unsafe = label > 0
    blocked = np.zeros(len(oof), bool)
    per_fold = {}
    for f in FOLDS:
        th = condition_thresholds(oof, label, kind, cond, fold != f, max_fpr)
        per_fold[f] = th
        sel = fold == f
        blocked[sel] = (oof >= np.array([th[c] for c in CONDITIONS])[cond])[sel]
    return {
        "thresholds": condition_thresholds(oof, label, kind, cond, np.ones(len(oof), bool), max_fpr),
        "nested_recall": round(float(blocked[unsafe].mean()), 4),
        "fpr": {k: round(float(blocked[(kind == k) & ~unsafe].mean()), 4) for k in KINDS},
        "recall_by_kind": {k: round(float(blocked[(kind == k) & unsafe].mean()), 3) for k in KINDS},
        "per_category": {c: round(float(blocked[label == i + 1].mean()), 3) for i, c in enumerate(cats)},
        "per_fold_en": {f: round(float(blocked[(fold == f) & (kind == "en") & unsafe].mean()), 3) for f in FOLDS},
        "per_fold_thresholds": per_fold,
    }


def _scored(arrays: list[np.ndarray], fold: np.ndarray) -> list[np.ndarray]:
    keep = fold != EXTRA
    return [a[keep] for a in arrays]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--max-fpr", type=float, default=0.05)
    ap.add_argument(
        "--ngrams",
        nargs="*",
        default=[],
        help="n-gram settings DIMS:SCALE:L2[:tr][:x|:xt], each a method (x: also fit on --extra's English rows and "
        "their misspelt and spaced variants; xt: and its translations)",
    )
    ap.add_argument("--extra", nargs=2, default=None, metavar=("EN", "TR"), help="training-only files (x / xt)")
    ap.add_argument(
        "--extra-en",
        nargs="*",
        default=[],
        help="more training-only English files (no translations), fitted with --extra's English rows (x / xt)",
    )
    ap.add_argument(
        "--extra-tr",
        nargs="*",
        default=[],
        help="training-only translation files (a lang column, no English rows), fitted with :x and :xt",
    )
    ap.add_argument("--save-oof", type=Path, default=None, help="a folder for the n-gram methods' out-of-fold scores")
    ap.add_argument("--per-category", action="store_true", help="also per-category thresholds (nested CV)")
    ap.add_argument(
        "--conditions",
        action="store_true",
        help="n-gram methods: also a threshold per prompt condition (long / other language / corrected / plain, "
        "gpufleet.safety.conditions; nested CV)",
    )
    ap.add_argument("--floors", type=float, nargs="*", default=[0.35, 0.4])
    ap.add_argument(
        "--long-floors",
        type=float,
        nargs="*",
        default=[],
        help="n-gram methods: also score each floor with a stricter one for prompts of more than one segment "
        "(every window and clause of a long prompt needs its nearest exemplar at least this similar to block)",
    )
    ap.add_argument(
        "--scenes",
        default=None,
        help="a training-only file of long benign scene descriptions (in tests/data/prompts): every segment of "
        "every row (as the filter cuts it) is a safe training row in every fold, never scored (n-gram specs "
        "with DIMS 0 only)",
    )
    ap.add_argument("--cache", type=Path, default=None, help="an .npz to keep the segment embeddings in between runs")
    ap.add_argument(
        "--spelling-unsafe-margin", type=float, default=None, help="the policy's spelling_unsafe_margin (a new cache)"
    )
    ap.add_argument(
        "--spelling-split-article", action="store_true", help="the policy's spelling_split_article (a new cache)"
    )
    ap.add_argument(
        "--spelling-margin-substitutions-only",
        action="store_true",
        help="the policy's spelling_margin_substitutions_only (with --spelling-unsafe-margin; a new cache)",
    )
    ap.add_argument(
        "--spelling-english-candidates",
        action="store_true",
        help="the policy's spelling_english_candidates (a new cache)",
    )
    ap.add_argument(
        "--spelling-english-only", action="store_true", help="the policy's spelling_english_only (a new cache)"
    )
    ap.add_argument(
        "--reuse-cache",
        type=Path,
        default=None,
        help="when --cache is not there yet: take the embedding of every segment text this earlier cache holds "
        "(one written with its texts) from it, encode only the others",
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    pf = PromptFilter()
    if (
        args.spelling_unsafe_margin is not None
        or args.spelling_split_article
        or args.spelling_english_only
        or args.spelling_margin_substitutions_only
        or args.spelling_english_candidates
    ):
        update = {
            "spelling_english_candidates": args.spelling_english_candidates,
            "spelling_margin_substitutions_only": args.spelling_margin_substitutions_only,
            "spelling_unsafe_margin": args.spelling_unsafe_margin,
            "spelling_split_article": args.spelling_split_article,
            "spelling_english_only": args.spelling_english_only,
        }
        pf = PromptFilter(pf.policy.model_copy(update=update), pf.encoder)
    cats = [c.name for c in pf.policy.categories]
    rows = load_rows(tuple(args.extra) if args.extra else None, tuple(args.extra_en), tuple(args.extra_tr))
    if args.cache and args.cache.is_file():
        with np.load(args.cache, allow_pickle=False) as d:
            vecs, flat, starts = d["vecs"], d["flat"], d["starts"]
        seg_idx = np.split(flat, starts[1:])
        assert len(seg_idx) == len(rows), "the cache was made for other rows (another --extra / --extra-en)"
    else:
        if args.reuse_cache:
            unique, seg_idx = segment_texts(pf, rows)
            with np.load(args.reuse_cache, allow_pickle=False) as d:
                known = dict(zip(d["texts"].tolist(), d["vecs"], strict=True))
            new = [t for t in unique if t not in known]
            fresh = dict(zip(new, embed_texts(pf, new), strict=True))
            vecs = np.stack([known[t] if t in known else fresh[t] for t in unique])
            print(f"{len(unique) - len(new)} segments from {args.reuse_cache}, {len(new)} encoded", flush=True)
        else:
            unique, seg_idx = segment_texts(pf, rows)
            vecs = embed_texts(pf, unique)
        if args.cache:
            starts = np.cumsum([0] + [len(s) for s in seg_idx[:-1]])
            np.savez(args.cache, vecs=vecs, flat=np.concatenate(seg_idx), starts=starts, texts=np.array(unique))
    print(f"{len(rows)} rows, {len(vecs)} segments embedded in {time.monotonic() - t0:.0f} s", flush=True)
    label = np.array([0 if r.label == "safe" else 1 + cats.index(r.category) for _, _, r in rows])
    cond = np.zeros(len(rows), dtype=int)
    if args.conditions:  # index into CONDITIONS; the judging's speller pass again (about a minute)
        cond = np.array([CONDITIONS.index(pf.judged(r.prompt)[2] or "plain") for _, _, r in rows])
    fold = np.array([f for f, _, _ in rows])
    kind = np.array([k for _, k, _ in rows])
    # a row's training vector: its first segment (every seen prompt but a few is one segment)
    first = np.array([s[0] for s in seg_idx])
    long_row = np.array([len(s) > 1 for s in seg_idx])
    scene_idx = np.zeros(0, dtype=int)
    if args.scenes:  # every segment of every scene row, embedded here (not cached), appended to the vectors
        scene_segs = list(
            dict.fromkeys(s for r in read_labelled(DATA / args.scenes) for s in pf.scored_segments(r.prompt)[1])
        )
        scene_idx = np.arange(len(vecs), len(vecs) + len(scene_segs))
        vecs = np.concatenate([vecs, pf.encoder.encode(scene_segs)])
        print(f"{len(scene_segs)} scene segments from {args.scenes}", flush=True)

    def train_xy(mask):
        return vecs[first[mask]], label[mask]

    methods = {
        "softmax (policy .4 head, no margin)": lambda m, m_tr: softmax_scorer(*train_xy(m), len(cats)),
        "softmax + margin 0.04 (policy .4)": lambda m, m_tr: softmax_scorer(
            *train_xy(m),
            len(cats),
            margin=0.04,
            safe_x=vecs[first[m & (kind == "en") & (label == 0)]],
            cat_x=[vecs[first[m & (kind == "en") & (label == i + 1)]] for i in range(len(cats))],
        ),
        "softmax+tr": lambda m, m_tr: softmax_scorer(*train_xy(m | m_tr), len(cats)),
        "softmax+tr l2=0.003": lambda m, m_tr: softmax_scorer(*train_xy(m | m_tr), len(cats), l2=0.003),
        "softmax+tr it=1500": lambda m, m_tr: softmax_scorer(*train_xy(m | m_tr), len(cats), iterations=1500),
        "binary+tr": lambda m, m_tr: binary_scorer(*train_xy(m | m_tr)),
        "binary+tr it=1500": lambda m, m_tr: binary_scorer(*train_xy(m | m_tr), iterations=1500),
        "mlp+tr": lambda m, m_tr: mlp_scorer(*train_xy(m | m_tr), len(cats)),
        "knn+tr": lambda m, m_tr: knn_scorer(*train_xy(m | m_tr)),
    }
    floors = (0.25, 0.3, 0.35, 0.4, 0.45)
    methods["softmax floor sweep"] = None
    out = {}
    if args.ngrams:
        unique: list[str] = []
        if any(int(spec.split(":")[0]) for spec in args.ngrams):  # the segments' texts, as the cache holds them
            unique, seg_check = segment_texts(pf, rows)
            same = len(unique) == len(vecs) and all((a == b).all() for a, b in zip(seg_check, seg_idx, strict=True))
            assert same, "the cache was made with another policy's segmentation or spelling"
        grams_by_dims = {}
        for spec in args.ngrams:
            parts = spec.split(":")
            dims_g, ngs, ngl2 = int(parts[0]), float(parts[1]), float(parts[2])
            with_tr = "tr" in parts[3:]
            extra_kinds = ("en", "misspelt", "spaced") if "x" in parts[3:] else KINDS if "xt" in parts[3:] else ()
            extra_kinds += (EXTRA_TR,) if extra_kinds else ()
            if dims_g not in grams_by_dims:  # 0: no n-grams (the embedding head alone)
                grams_by_dims[dims_g] = hashed_ngrams(unique, dims_g) if dims_g else None
            gall = grams_by_dims[dims_g]
            t = time.monotonic()
            assert gall is None or not len(scene_idx), "--scenes with n-grams: not supported"
            # (floor, long-prompt floor): every floor alone, and with each stricter floor for long prompts
            combos = [(fl, fl) for fl in args.floors] + [(fl, lf) for fl in args.floors for lf in args.long_floors]
            all_floors = sorted(set(args.floors) | set(args.long_floors))
            oofs = {c: np.zeros(len(rows)) for c in combos}
            oof_cat = {c: np.zeros(len(rows), dtype=int) for c in combos}
            for f in FOLDS:
                train = (fold != f) & (fold != EXTRA) & (kind != "buried") & ((kind != "translated") | with_tr)
                train |= (fold == EXTRA) & np.isin(kind, extra_kinds)
                tr_rows = np.concatenate([first[train], scene_idx])
                tr_label = np.concatenate([label[train], np.zeros(len(scene_idx), dtype=label.dtype)])
                by_floor, probs = ngram_floor_scorers(
                    vecs[tr_rows],
                    gall.take(tr_rows) if gall is not None else None,
                    tr_label,
                    len(cats),
                    all_floors,
                    dims_g=dims_g,
                    ngram_scale=ngs,
                    ngram_l2=ngl2,
                )(vecs, gall)
                held = np.flatnonzero(fold == f)
                segcat = probs[:, 1:].argmax(axis=1)
                for fl, lf in combos:
                    top = []
                    for i in held:
                        sc = by_floor[lf] if long_row[i] else by_floor[fl]
                        top.append((sc, seg_idx[i][int(np.argmax(sc[seg_idx[i]]))]))
                    oofs[fl, lf][held] = [sc[j] for sc, j in top]
                    oof_cat[fl, lf][held] = [segcat[j] for _, j in top]
            for (fl, lf), oof in oofs.items():
                name = f"ngrams {spec} floor {fl}" + (f" long {lf}" if lf != fl else "")
                name += f" scenes {args.scenes}" if args.scenes else ""
                s_oof, s_cat, s_label, s_kind, s_fold, s_cond = _scored(
                    [oof, oof_cat[fl, lf], label, kind, fold, cond], fold
                )
                out[name] = operating_point(s_oof, s_label, s_kind, s_fold, cats, args.max_fpr)
                if args.conditions:
                    out[name]["conditions"] = condition_figures(s_oof, s_label, s_kind, s_fold, s_cond, cats, args.max_fpr)
                if args.per_category:
                    out[name]["per_category_thresholds"] = nested_per_category(
                        s_oof, s_cat, s_label, s_kind, s_fold, cats, args.max_fpr
                    )
                out[name]["per_paragraph_fpr"] = paragraph_fpr(
                    s_oof, s_label, s_kind, rows, fold, out[name]["threshold"]
                )
                out[name]["s"] = round(time.monotonic() - t, 1)
                print(name, json.dumps(out[name]), flush=True)
                if args.save_oof:
                    tag = f"{spec.replace(':', '_')}_{fl}" + (f"_long{lf}" if lf != fl else "")
                    tag += "_scenes" if args.scenes else ""
                    np.save(args.save_oof / f"oof_{tag}.npy", oof)
                    np.save(args.save_oof / f"cat_{tag}.npy", oof_cat[fl, lf])
    for name, make in methods.items():
        if args.only and name not in args.only:
            continue
        t = time.monotonic()
        if make is None:  # the floor sweep: one fit per fold, every floor scored from it
            oofs = {fl: np.zeros(len(rows)) for fl in floors}
            for f in FOLDS:
                train = (fold != f) & (fold != EXTRA) & ~np.isin(kind, ["translated", "buried"])
                by_floor = softmax_floor_scorers(*train_xy(train), len(cats), floors)(vecs)
                held = np.flatnonzero(fold == f)
                for fl, s in by_floor.items():
                    oofs[fl][held] = [s[seg_idx[i]].max() for i in held]
            for fl, oof in oofs.items():
                out[f"softmax floor {fl}"] = operating_point(
                    *_scored([oof, label, kind, fold], fold), cats, args.max_fpr
                )
                print(f"softmax floor {fl}", json.dumps(out[f"softmax floor {fl}"]), flush=True)
            continue
        oof = np.zeros(len(rows))
        for f in FOLDS:
            train = (fold != f) & (fold != EXTRA) & ~np.isin(kind, ["translated", "buried"])
            train_tr = (fold != f) & (fold != EXTRA) & (kind == "translated")
            score = make(train, train_tr)
            held = np.flatnonzero(fold == f)
            s = score(vecs)
            oof[held] = [s[seg_idx[i]].max() for i in held]
        res = operating_point(*_scored([oof, label, kind, fold], fold), cats, args.max_fpr)
        res["s"] = round(time.monotonic() - t, 1)
        out[name] = res
        print(name, json.dumps(res), flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
