"""Near-duplicate scan of one labelled prompt file against the others in tests/data/prompts.

Two measures per row of FILE: the character 4-gram Jaccard similarity to the nearest row of the other files
(:mod:`gpufleet.safety.overlap`) and, with ``--embed``, the cosine similarity of the filter's encoder (USE
multilingual v3) to the nearest row, so that translations and paraphrases show too. ``--exclude`` leaves files
out of the comparison (a file's own translations). Prints the closest pairs, then one JSON object.

Usage:
  .venv/bin/python benchmarks/prompt_overlap.py test2.tsv --exclude translations2.tsv --embed
  .venv/bin/python benchmarks/prompt_overlap.py translations2.tsv --exclude test2.tsv --embed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufleet.safety.evaluation import read_labelled  # noqa: E402
from gpufleet.safety.overlap import nearest  # noqa: E402

DATA = ROOT / "tests" / "data" / "prompts"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a file name in tests/data/prompts")
    ap.add_argument("--exclude", nargs="*", default=[], help="file names not compared against")
    ap.add_argument("--embed", action="store_true", help="also the encoder's cosine similarity")
    ap.add_argument("--show", type=int, default=15)
    args = ap.parse_args()
    rows = [r.prompt for r in read_labelled(DATA / args.file)]
    others = [
        (p.name, r.prompt)
        for p in sorted(DATA.glob("*.tsv"))
        if p.name != args.file and p.name not in args.exclude
        for r in read_labelled(p)
    ]
    where = {t: n for n, t in others}
    lexical = nearest(rows, [t for _, t in others])
    print("character 4-gram Jaccard, closest pairs:")
    for m in lexical[: args.show]:
        print(f"  {m.similarity:.2f}  {m.prompt}  ||  {where[m.nearest]}: {m.nearest}")
    out = {
        "file": args.file,
        "rows": len(rows),
        "compared_with": sorted({n for n, _ in others}),
        "jaccard_max": lexical[0].similarity if lexical else 0.0,
        "jaccard_ge_0.5": sum(m.similarity >= 0.5 for m in lexical),
        "jaccard_ge_0.4": sum(m.similarity >= 0.4 for m in lexical),
    }
    if args.embed:
        import numpy as np

        from gpufleet.safety.encoder import encoder_for

        enc = encoder_for("use-multilingual-v3")
        sims = enc.encode(rows) @ enc.encode([t for _, t in others]).T
        best, arg = sims.max(axis=1), sims.argmax(axis=1)
        print("encoder cosine, closest pairs:")
        for i in np.argsort(-best)[: args.show]:
            name, text = others[int(arg[i])]
            print(f"  {best[i]:.2f}  {rows[i]}  ||  {name}: {text}")
        out.update(
            cosine_max=round(float(best.max()), 4),
            cosine_median=round(float(np.median(best)), 4),
            cosine_ge_0_85=int((best >= 0.85).sum()),
            cosine_ge_0_8=int((best >= 0.8).sum()),
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
