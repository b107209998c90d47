"""Measure the tier-1 filter on a labelled prompt set: recall and false-positive rate, overall and per category.

Contract:
- :func:`read_labelled` reads a TSV (a header naming the columns, among them
  ``label`` and ``prompt`` and optionally ``category`` and ``lang``; without a
  header, ``label<TAB>prompt`` or ``label<TAB>category<TAB>prompt``) or a JSONL
  file (objects with ``prompt``, ``label`` and optionally ``category``, ``lang``). A label
  is ``safe`` or ``unsafe``; a row whose label is a category name (the old
  ``category<TAB>prompt`` files) is unsafe in that category. Raises ValueError
  naming the line for anything else.
- :func:`evaluate` turns rows and the filter's decisions into an
  :class:`Evaluation`: per category of the unsafe rows, how many were blocked
  (under any category: recall); of the safe rows, how many were blocked (false
  positives, FPR); per category of safe rows that carry one (benign prompts
  near a topic) their FPR too.
- :func:`drift` compares an evaluation with a recorded one (``as_dict`` output).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LABELS = ("safe", "unsafe")


@dataclass(frozen=True)
class LabelledPrompt:
    prompt: str
    label: str
    category: str = ""
    lang: str = ""


def _row(parts: list[str], where: str, lang: str = "") -> LabelledPrompt:
    if len(parts) == 2:
        label, prompt = parts
        category = ""
    elif len(parts) >= 3:
        label, category, prompt = parts[0], parts[1], "\t".join(parts[2:])
    else:
        raise ValueError(f"{where}: expected label<TAB>prompt or label<TAB>category<TAB>prompt")
    label, category = label.strip(), category.strip()
    if label not in LABELS:
        if not label:
            raise ValueError(f"{where}: empty label")
        label, category = "unsafe", category or label
    if not prompt.strip():
        raise ValueError(f"{where}: empty prompt")
    return LabelledPrompt(prompt.strip(), label, category, lang.strip())


def parse_labelled(text: str, name: str = "<input>") -> list[LabelledPrompt]:
    """Rows of a labelled set given as text (JSONL when the first non-blank line is a JSON object, else TSV)."""
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    out: list[LabelledPrompt] = []
    if first.lstrip().startswith("{"):
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                label = str(obj["label"]).strip()
                prompt = str(obj["prompt"])
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{name}:{n}: not a JSON object with prompt and label ({err})")
            out.append(_row([label, str(obj.get("category") or ""), prompt], f"{name}:{n}", str(obj.get("lang") or "")))
        return out
    columns: list[str] | None = None
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        names = [p.strip().lower() for p in parts]
        if columns is None and out == [] and {"label", "prompt"} <= set(names):
            columns = names
            continue
        if columns is not None:
            if len(parts) != len(columns):
                raise ValueError(f"{name}:{n}: {len(parts)} fields, the header names {len(columns)}")
            f = dict(zip(columns, parts, strict=True))
            out.append(_row([f["label"], f.get("category", ""), f["prompt"]], f"{name}:{n}", f.get("lang", "")))
        else:
            out.append(_row(parts, f"{name}:{n}"))
    return out


def read_labelled(path: str | Path) -> list[LabelledPrompt]:
    p = Path(path)
    return parse_labelled(p.read_text(encoding="utf-8"), p.name)


@dataclass(frozen=True)
class Counts:
    n: int = 0
    blocked: int = 0

    def rate(self) -> float | None:
        return self.blocked / self.n if self.n else None


@dataclass(frozen=True)
class Evaluation:
    unsafe: Counts
    safe: Counts
    per_category: dict[str, Counts] = field(default_factory=dict)  # unsafe rows: blocked = true positives
    safe_per_category: dict[str, Counts] = field(default_factory=dict)  # safe rows near a topic: blocked = FPs
    misses: tuple[LabelledPrompt, ...] = ()
    false_positives: tuple[tuple[LabelledPrompt, str | None], ...] = ()

    @property
    def recall(self) -> float | None:
        return self.unsafe.rate()

    @property
    def fpr(self) -> float | None:
        return self.safe.rate()

    def as_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "overall": {
                "unsafe": self.unsafe.n,
                "blocked": self.unsafe.blocked,
                "recall": r(self.recall),
                "safe": self.safe.n,
                "false_positives": self.safe.blocked,
                "fpr": r(self.fpr),
            },
            "categories": {
                c: {"unsafe": k.n, "blocked": k.blocked, "recall": r(k.rate())}
                for c, k in sorted(self.per_category.items())
            },
            "safe_categories": {
                c: {"safe": k.n, "false_positives": k.blocked, "fpr": r(k.rate())}
                for c, k in sorted(self.safe_per_category.items())
            },
        }


def evaluate(rows: Sequence[LabelledPrompt], decisions: Iterable[Any]) -> Evaluation:
    """``decisions``: one per row, each with ``allowed`` and ``category`` (a :class:`PromptDecision`)."""
    unsafe, safe = Counts(), Counts()
    per: dict[str, Counts] = {}
    safe_per: dict[str, Counts] = {}
    misses: list[LabelledPrompt] = []
    fps: list[tuple[LabelledPrompt, str | None]] = []
    decisions = list(decisions)
    if len(decisions) != len(rows):
        raise ValueError(f"{len(rows)} rows but {len(decisions)} decisions")
    for row, d in zip(rows, decisions, strict=True):
        blocked = int(not d.allowed)
        if row.label == "unsafe":
            unsafe = Counts(unsafe.n + 1, unsafe.blocked + blocked)
            c = per.get(row.category or "unsafe", Counts())
            per[row.category or "unsafe"] = Counts(c.n + 1, c.blocked + blocked)
            if not blocked:
                misses.append(row)
        else:
            safe = Counts(safe.n + 1, safe.blocked + blocked)
            if row.category:
                c = safe_per.get(row.category, Counts())
                safe_per[row.category] = Counts(c.n + 1, c.blocked + blocked)
            if blocked:
                fps.append((row, d.category))
    return Evaluation(unsafe, safe, per, safe_per, tuple(misses), tuple(fps))


def error_lines(ev: Evaluation, indent: str = "", tail: int | None = None) -> list[str]:
    """One line per miss and per false positive (``tail``: only the last characters of each prompt)."""

    def cut(text: str) -> str:
        return text[-tail:] if tail else text

    lines = [f"{indent}miss [{m.category or 'unsafe'}] {cut(m.prompt)}" for m in ev.misses]
    return lines + [f"{indent}false positive [{c}] {cut(r.prompt)}" for r, c in ev.false_positives]


def drift(current: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Change of recall / FPR (current − baseline) overall and per category, for the keys both have."""
    out: dict[str, Any] = {}
    for key in ("recall", "fpr"):
        a, b = current.get("overall", {}).get(key), baseline.get("overall", {}).get(key)
        if a is not None and b is not None:
            out[key] = round(a - b, 4)
    cats = {}
    for name, now in current.get("categories", {}).items():
        then = baseline.get("categories", {}).get(name)
        if then and now.get("recall") is not None and then.get("recall") is not None:
            cats[name] = round(now["recall"] - then["recall"], 4)
    out["categories"] = cats
    return out


def format_table(ev: Evaluation) -> str:
    """A plain-text table: one row per category (recall) and per benign topic (FPR), then the overall line."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [f"{'CATEGORY':<18} {'N':>5} {'BLOCKED':>7} {'RECALL':>7}"]
    for c, k in sorted(ev.per_category.items()):
        lines.append(f"{c:<18} {k.n:>5} {k.blocked:>7} {pct(k.rate()):>7}")
    if ev.safe_per_category:
        lines.append(f"{'SAFE NEAR':<18} {'N':>5} {'FP':>7} {'FPR':>7}")
        for c, k in sorted(ev.safe_per_category.items()):
            lines.append(f"{c:<18} {k.n:>5} {k.blocked:>7} {pct(k.rate()):>7}")
    lines.append(
        f"overall: recall {pct(ev.recall)} ({ev.unsafe.blocked}/{ev.unsafe.n} unsafe blocked), "
        f"FPR {pct(ev.fpr)} ({ev.safe.blocked}/{ev.safe.n} safe blocked)"
    )
    return "\n".join(lines)
