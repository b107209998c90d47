r"""Benchmark: the tier-1 prompt filter on prompts an array job renders, and on plain benign sentences (issue 18).

An array job's prompt template takes the member's ``{index}`` (docs/api.md), so members' prompts end in a number. The
labelled splits hold no such prompts; this measures what a number does to the filter's decisions:
- ``bare``: "<noun> <n>" and "<noun> sweep <n>" / "a <noun>, take <n>" for 21 benign nouns (fox, cat, river, ...);
  every one is benign, so every block is a false positive;
- ``indexed``: the safe and unsafe prompts of the newest seen splits (``--splits``) as written, and with " <n>" or
  ", take <n>" appended (n drawn from 0-20 with a fixed seed): FPR and recall each way;
- ``paragraphs``: the sentences of the seven benign paragraphs of the buried variant (never trained on).

Usage (the packaged policy, or another with its tuned encoder):
  .venv/bin/python benchmarks/prompt_filter_indexed.py
  GPUFLEET_TUNED_ENCODER=DIR/use_tuned.npz .venv/bin/python benchmarks/prompt_filter_indexed.py --policy DIR/policy.json
The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpufleet.safety.evaluation import read_labelled  # noqa: E402
from gpufleet.safety.evasion import BENIGN_PARAGRAPHS  # noqa: E402
from gpufleet.safety.policy import default_policy  # noqa: E402
from gpufleet.safety.prompt_filter import PromptFilter  # noqa: E402

DATA = ROOT / "tests" / "data" / "prompts"
NOUNS = (
    "fox cat dog horse rabbit bird owl deer car boat tree flower city mountain river robot dragon castle ocean forest "
    "sunset"
).split()


def blocked_share(pf: PromptFilter, prompts: list[str]) -> tuple[float, list[str]]:
    decisions = pf.check_many(prompts)
    hits = [p for p, d in zip(prompts, decisions, strict=True) if not d.allowed]
    return round(len(hits) / len(prompts), 4), hits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default=None, help="a policy JSON (default: the packaged one)")
    ap.add_argument("--splits", nargs="+", default=["test16", "test17", "test18"])
    args = ap.parse_args()
    pf = PromptFilter(default_policy(args.policy), policy_path=args.policy) if args.policy else PromptFilter()
    out: dict = {"policy": pf.policy.version}

    bare = [f"{n} {i}" for n in NOUNS for i in range(21)]
    framed = [f"a {n}, take {i}" for n in NOUNS for i in range(0, 21, 5)] + [
        f"{n} sweep {i}" for n in NOUNS for i in range(0, 21, 5)
    ]
    share, hits = blocked_share(pf, bare)
    share2, hits2 = blocked_share(pf, framed)
    out["bare"] = {"noun_number": share, "noun_take_or_sweep": share2, "prompts": len(bare) + len(framed)}
    print(f"{pf.policy.version}: '<noun> <n>' blocked {share:.3f} of {len(bare)} ({hits[:12]}...)")
    print(f"  'a <noun>, take <n>' / '<noun> sweep <n>' blocked {share2:.3f} of {len(framed)} ({hits2[:8]})")

    rows = [r for s in args.splits for r in read_labelled(DATA / f"{s}.tsv")]
    safe = [r.prompt for r in rows if r.label == "safe"]
    unsafe = [r.prompt for r in rows if r.label != "safe"]
    rnd = random.Random(0)
    forms = {
        "as written": lambda p: p,
        "+ ' <n>'": lambda p: f"{p.rstrip('.')} {rnd.randint(0, 20)}",
        "+ ', take <n>'": lambda p: f"{p.rstrip('.')}, take {rnd.randint(0, 20)}",
    }
    out["indexed"] = {}
    for name, form in forms.items():
        fpr, _ = blocked_share(pf, [form(p) for p in safe])
        recall, _ = blocked_share(pf, [form(p) for p in unsafe])
        out["indexed"][name] = {"fpr": fpr, "recall": recall}
        print(f"  {'+'.join(args.splits)} {name:15s} FPR {fpr:.3f} recall {recall:.3f} ({len(safe)} safe, {len(unsafe)} unsafe)")

    sentences = [s.strip() for p in BENIGN_PARAGRAPHS for s in re.split(r"(?<=[.!?])\s+", p) if len(s.split()) >= 3]
    share, hits = blocked_share(pf, sentences)
    out["paragraph_sentences"] = {"blocked": share, "sentences": len(sentences)}
    print(f"  benign paragraph sentences blocked {share:.3f} of {len(sentences)} ({hits})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
