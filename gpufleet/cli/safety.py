"""``gpufleet safety``: measure the tier-1 prompt filter on an operator's own labelled prompts.

``gpufleet safety eval FILE`` reads a labelled set (TSV with a ``label``/``category``/``prompt`` header, or
JSONL objects with ``prompt``, ``label``, ``category``; ``-`` reads stdin; see
:mod:`gpufleet.safety.evaluation`), judges every prompt with the filter of this installation (``--policy``:
another policy file) and prints recall per category, the false-positive rate and the misses. With
``--baseline FILE`` (an earlier ``safety eval --json``, or a recorded ``{"sets": {...}}`` file with
``--baseline-set``) it prints the drift: the change of recall and FPR overall and per category. Rows that
carry the decision recorded when their job ran (operators' reports, ``decision``: ``{"allowed": ...}``) are
also scored as recorded, and the drift of today's filter against that is shown. Runs locally: no API call.

``gpufleet safety calibrate FILE --out DIR [--max-fpr B]`` chooses the filter's thresholds per prompt condition
(long, other language, corrected, plain) on a labelled set: every prompt judged as CheckPrompt judges it, each
condition's threshold the lowest that keeps the false-positive rate of every language in the file within ``B``
(:mod:`gpufleet.safety.calibrate`). It writes ``DIR/policy.json`` (this policy with those thresholds) and its fitted
state beside it; a deployment uses it through ``GPUFLEET_PROMPT_POLICY``. The figures it prints are on the file it
was fitted on: measure the policy on other labelled prompts (``safety eval --policy DIR/policy.json``) before using
it. Runs locally.

``gpufleet safety report JOB --label unsafe|safe [--category C]`` (operators) reads the job through
``GET /v1/admin/jobs/{id}`` (its prompt, as CheckPrompt judged it, and its ``prompt_checked`` decision) and
stores the report through the administration API (``PUT /v1/admin/safety-reports/{job}``: conditional,
audited as ``safety.report``; relabelling needs ``--expected-version`` or takes the version read just before).
``gpufleet safety reports`` lists them; ``--jsonl`` prints them as an evaluation set for ``safety eval``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpufleet.cli.common import EXIT_OK, add_connection_args, add_json_arg, make_client, print_json
from gpufleet.errors import ValidationFailed


def register(sub: argparse._SubParsersAction) -> None:
    safety = sub.add_parser(
        "safety", help="tier-1 prompt filter: evaluate on labelled prompts", description=__doc__.split("\n\n")[0]
    )
    ssub = safety.add_subparsers(dest="safety_command", required=True)
    ev = ssub.add_parser(
        "eval", help="recall and false-positive rate per category on a labelled file", description=__doc__
    )
    ev.add_argument("file", metavar="FILE", help="labelled prompts: TSV or JSONL ('-': stdin)")
    ev.add_argument("--policy", metavar="FILE", help="policy JSON (default: the packaged one)")
    ev.add_argument("--baseline", metavar="FILE", help="earlier figures to show drift against")
    ev.add_argument("--baseline-set", metavar="NAME", help='with a {"sets": ...} baseline: the set to compare')
    add_json_arg(ev)
    ev.set_defaults(func=run_eval)
    cal = ssub.add_parser(
        "calibrate", help="thresholds per prompt condition chosen on a labelled file", description=__doc__
    )
    cal.add_argument("file", metavar="FILE", help="labelled prompts: TSV or JSONL ('-': stdin)")
    cal.add_argument("--out", required=True, metavar="DIR", help="where policy.json and its fitted state go")
    cal.add_argument(
        "--max-fpr", type=float, default=0.05, help="false-positive budget per language in the file (default 0.05)"
    )
    cal.add_argument("--policy", metavar="FILE", help="the policy to calibrate (default: the packaged one)")
    cal.add_argument("--version", help="the calibrated policy's version (default: VERSION+calibrated)")
    add_json_arg(cal)
    cal.set_defaults(func=run_calibrate)
    rep = ssub.add_parser(
        "report", help="operators: label a job's prompt decision (a miss or a false positive)", description=__doc__
    )
    rep.add_argument("job_id", metavar="JOB")
    rep.add_argument(
        "--label",
        required=True,
        choices=["unsafe", "safe"],
        help="unsafe: the filter should have blocked it; safe: it should not have",
    )
    rep.add_argument("--category", help="the policy category of an unsafe prompt (default: the decision's)")
    rep.add_argument("--note", help="free text kept with the report")
    rep.add_argument("--expected-version", type=int, help="relabel only if the stored report is this version")
    lst = ssub.add_parser("reports", help="operators: the stored reports (an evaluation set)", description=__doc__)
    lst.add_argument("--jsonl", action="store_true", help="one JSON object a line: `safety eval` reads it")
    for p in (rep, lst):
        add_connection_args(p)
        add_json_arg(p)
    rep.set_defaults(func=run_report)
    lst.set_defaults(func=run_reports)


#: a condition with fewer safe prompts than this in the file keeps the policy's threshold (too few to choose one)
MIN_SAFE_PER_CONDITION = 20
#: the thresholds written lie in [MIN_THRESHOLD, MAX_THRESHOLD] (a policy's head threshold is in (0, 1))
MIN_THRESHOLD, MAX_THRESHOLD = 1e-4, 0.9999


#: a condition calibrated on fewer safe prompts than this is flagged: its threshold may not hold on new prompts
FEW_SAFE_PER_CONDITION = 100


def _caveat(kept: bool, safe: int) -> str:
    if kept:
        return ", kept: too few to choose"
    return ", few: may not hold on new prompts" if safe < FEW_SAFE_PER_CONDITION else ""


def load_policy(path: str | None):
    """The policy at ``path`` (None: the packaged one); a missing or invalid file is a clear error."""
    from gpufleet.safety.policy import default_policy

    try:
        return default_policy(path)
    except (OSError, ValueError) as err:
        raise ValidationFailed(f"policy {path}: {err}")


def _read_text(path: str) -> tuple[str, str]:
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    p = Path(path)
    if not p.is_file():
        raise ValidationFailed(f"{path}: no such file")
    return p.read_text(encoding="utf-8"), p.name


def load_baseline(path: str, set_name: str | None) -> dict[str, Any]:
    """The ``{"overall", "categories"}`` figures of a baseline file (pure but for the read)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValidationFailed(f"baseline {path}: {err}")
    if "sets" in doc:
        sets = doc["sets"]
        name = set_name or (next(iter(sets)) if len(sets) == 1 else None)
        if name not in sets:
            raise ValidationFailed(f"baseline {path}: name the set with --baseline-set ({', '.join(sorted(sets))})")
        doc = sets[name]
    doc = doc.get("evaluation", doc)
    if "overall" not in doc:
        raise ValidationFailed(f"baseline {path}: no overall figures")
    return doc


class _Recorded:
    def __init__(self, allowed: bool, category: str | None) -> None:
        self.allowed, self.category = allowed, category


def recorded_decisions(text: str) -> list[_Recorded] | None:
    """The decisions recorded with the rows of a JSONL file (every row must carry one), else None."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            decision = json.loads(line).get("decision")
        except (ValueError, AttributeError):
            return None
        if not isinstance(decision, dict) or "allowed" not in decision:
            return None
        out.append(_Recorded(bool(decision["allowed"]), decision.get("category")))
    return out or None


def _drift_lines(title: str, d: dict[str, Any]) -> list[str]:
    def sign(x: float) -> str:
        return f"{x:+.3f}"

    lines = [f"drift against {title}: recall {sign(d.get('recall', 0.0))}, FPR {sign(d.get('fpr', 0.0))}"]
    lines += [f"  {c:<18} recall {sign(x)}" for c, x in sorted(d.get("categories", {}).items()) if x]
    return lines


def run_eval(args: argparse.Namespace) -> int:
    from gpufleet.safety.evaluation import drift, error_lines, evaluate, format_table, parse_labelled
    from gpufleet.safety.prompt_filter import PromptFilter

    text, name = _read_text(args.file)
    try:
        rows = parse_labelled(text, name)
    except ValueError as err:
        raise ValidationFailed(str(err))
    if not rows:
        raise ValidationFailed(f"{name}: no labelled prompts")
    baseline = load_baseline(args.baseline, args.baseline_set) if args.baseline else None
    pf = PromptFilter(load_policy(args.policy), policy_path=args.policy)
    ev = evaluate(rows, pf.check_many([r.prompt for r in rows]))
    out: dict[str, Any] = {
        "file": name,
        "policy": pf.policy.version,
        "encoder": pf.encoder.name,
        "evaluation": ev.as_dict(),
        "misses": [{"category": m.category, "prompt": m.prompt} for m in ev.misses],
        "false_positives": [{"blocked_as": c, "prompt": r.prompt} for r, c in ev.false_positives],
    }
    recorded = recorded_decisions(text) if not text.lstrip().startswith("label") else None
    if recorded is not None and len(recorded) == len(rows):
        as_recorded = evaluate(rows, recorded).as_dict()
        out["as_recorded"] = as_recorded
        out["drift_vs_recorded"] = drift(out["evaluation"], as_recorded)
    if baseline is not None:
        out["drift_vs_baseline"] = drift(out["evaluation"], baseline)
    if args.json:
        print_json(out)
        return EXIT_OK
    print(f"{name}: {len(rows)} prompts, policy {pf.policy.version} ({pf.encoder.name})")
    print("\n".join([format_table(ev), *error_lines(ev)]))
    if "as_recorded" in out:
        o = out["as_recorded"]["overall"]
        print(f"as recorded when the jobs ran: recall {o['recall']}, FPR {o['fpr']}")
        print("\n".join(_drift_lines("the recorded decisions", out["drift_vs_recorded"])))
    if baseline is not None:
        print("\n".join(_drift_lines(args.baseline, out["drift_vs_baseline"])))
    return EXIT_OK


def calibrated_policy_doc(source: dict[str, Any], thresholds: dict[str, float], version: str) -> dict[str, Any]:
    """The policy JSON ``source`` with the head's thresholds per condition (``plain``: its threshold) (pure)."""
    logistic = dict(source.get("logistic") or {})
    logistic["threshold"] = thresholds["plain"]
    logistic["condition_thresholds"] = {c: t for c, t in thresholds.items() if c != "plain"}
    return {**source, "version": version, "logistic": logistic}


def run_calibrate(args: argparse.Namespace) -> int:
    import numpy as np

    from gpufleet.safety import calibrate, fitted
    from gpufleet.safety.evaluation import parse_labelled
    from gpufleet.safety.policy import DEFAULT_POLICY_PATH, Policy
    from gpufleet.safety.prompt_filter import PromptFilter

    if not 0 <= args.max_fpr < 1:
        raise ValidationFailed(f"--max-fpr must be in [0, 1): {args.max_fpr}")
    out = Path(args.out)
    target = out / "policy.json"
    if target.exists():
        raise ValidationFailed(f"{target} exists: give another --out")
    text, name = _read_text(args.file)
    try:
        rows = parse_labelled(text, name)
    except ValueError as err:
        raise ValidationFailed(str(err))
    unsafe = np.array([r.label == "unsafe" for r in rows], dtype=bool)
    if not unsafe.any() or unsafe.all():
        raise ValidationFailed(
            f"{name}: calibrating needs both safe and unsafe prompts ({int(unsafe.sum())} unsafe of {len(rows)})"
        )
    pf = PromptFilter(load_policy(args.policy), policy_path=args.policy)
    source = json.loads((Path(args.policy) if args.policy else DEFAULT_POLICY_PATH).read_text(encoding="utf-8"))
    try:
        conds, scores = pf.blocking_scores([r.prompt for r in rows])
    except ValueError as err:
        raise ValidationFailed(f"policy {pf.policy.version}: {err}")
    conditions = calibrate.CONDITIONS
    cond = np.array([conditions.index(c or "plain") for c in conds])
    lang = np.array([r.lang or "en" for r in rows])
    spec = pf.policy.logistic
    assert spec is not None  # blocking_scores refused a policy without a head
    safe_per_condition = {c: int((~unsafe & (cond == i)).sum()) for i, c in enumerate(conditions)}
    kept = {
        c: spec.threshold_for("", None if c == "plain" else c)
        for c, n in safe_per_condition.items()
        if n < MIN_SAFE_PER_CONDITION
    }
    everything = np.ones(len(rows), dtype=bool)
    fitted_th = calibrate.condition_thresholds(
        scores, unsafe, lang, cond, conditions, everything, args.max_fpr, fixed=kept
    )
    th = {c: min(max(t, MIN_THRESHOLD), MAX_THRESHOLD) for c, t in fitted_th.items()}
    doc = calibrated_policy_doc(source, th, args.version or f"{pf.policy.version}+calibrated")
    try:
        policy = Policy.model_validate(doc)
    except ValueError as err:
        raise ValidationFailed(f"the calibrated policy is not valid: {err}")
    out.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    pf.save_fitted(fitted.fitted_path(target), policy)
    blocked = calibrate.blocked(scores, cond, conditions, th)
    per_lang = {
        g: {
            "unsafe": int((unsafe & (lang == g)).sum()),
            "safe": int((~unsafe & (lang == g)).sum()),
            "recall": round(float(blocked[unsafe & (lang == g)].mean()), 4) if (unsafe & (lang == g)).any() else None,
            "fpr": round(float(blocked[~unsafe & (lang == g)].mean()), 4) if (~unsafe & (lang == g)).any() else None,
        }
        for g in dict.fromkeys(lang.tolist())
    }
    result = {
        "file": name,
        "source_policy": pf.policy.version,
        "policy": policy.version,
        "written": str(target),
        "max_fpr": args.max_fpr,
        "thresholds": th,
        "safe_per_condition": safe_per_condition,
        "kept": sorted(kept),
        "in_sample": per_lang,
    }
    if args.json:
        print_json(result)
        return EXIT_OK
    print(f"{name}: {len(rows)} prompts; policy {pf.policy.version} calibrated at FPR <= {args.max_fpr} per language")
    print(
        "thresholds: "
        + ", ".join(
            f"{c} {t:.4f} ({safe_per_condition[c]} safe{_caveat(c in kept, safe_per_condition[c])})"
            for c, t in th.items()
        )
    )
    for g, f in per_lang.items():
        print(f"  {g}: recall {f['recall']} ({f['unsafe']} unsafe), FPR {f['fpr']} ({f['safe']} safe) — on this file")
    print(
        f"wrote {target} (version {policy.version}); measure it on other prompts: "
        f"gpufleet safety eval FILE --policy {target}"
    )
    return EXIT_OK


def judged_prompt(inspection: dict[str, Any]) -> str:
    """The text CheckPrompt judged for a job (prompt and negative prompt), from ``GET /v1/admin/jobs/{id}``."""
    workload = ((inspection.get("job") or {}).get("spec") or {}).get("workload") or {}
    text = " ".join(p for p in (workload.get("prompt"), workload.get("negative_prompt")) if p)
    if not text:
        raise ValidationFailed("the job has no prompt (a container job): nothing to report")
    return text


def recorded_decision(inspection: dict[str, Any]) -> dict[str, Any] | None:
    """The detail of the job's last ``prompt_checked`` event (None: not among the inspected events)."""
    checked = [e.get("detail") or {} for e in inspection.get("events") or [] if e.get("type") == "prompt_checked"]
    return checked[-1] if checked else None


def report_body(
    inspection: dict[str, Any], label: str, category: str | None, note: str | None, expected_version: int | None
) -> dict[str, Any]:
    """The ``PUT /v1/admin/safety-reports/{job}`` body for a job (pure)."""
    decision = recorded_decision(inspection)
    recorded = decision or {}  # a blocked prompt's category, else the nearest one the filter saw in an allowed prompt
    category = category or recorded.get("category") or recorded.get("nearest_category") if label == "unsafe" else category
    body = {
        "label": label,
        "category": category,
        "prompt": judged_prompt(inspection),
        "decision": decision,
        "note": note,
        "expected_version": expected_version,
    }
    return {k: v for k, v in body.items() if v is not None}


def as_labelled(report: dict[str, Any]) -> dict[str, Any]:
    """A stored report as a row of an evaluation set (``safety eval`` JSONL)."""
    row = {
        "prompt": report["prompt"],
        "label": report["label"],
        "category": report.get("category") or "",
        "job_id": report.get("job_id"),
    }
    if report.get("decision"):
        row["decision"] = report["decision"]
    return row


def run_report(args: argparse.Namespace) -> int:
    client = make_client(args)
    body = report_body(client.inspect(args.job_id), args.label, args.category, args.note, args.expected_version)
    stored = client.request("PUT", f"/v1/admin/safety-reports/{args.job_id}", body=body).body
    if args.json:
        print_json(stored)
    else:
        decision = stored.get("decision") or {}
        was = (
            "no recorded decision"
            if "allowed" not in decision
            else ("allowed" if decision["allowed"] else f"blocked as {decision.get('category')}")
        )
        print(
            f"{stored['job_id']}: reported {stored['label']}"
            f"{' (' + stored['category'] + ')' if stored.get('category') else ''}; the filter had {was}"
            f"{' — a ' + stored['kind'].replace('_', ' ') if stored.get('kind') else ''} (version {stored['version']})"
        )
    return EXIT_OK


def run_reports(args: argparse.Namespace) -> int:
    items = make_client(args).request("GET", "/v1/admin/safety-reports").body.get("items") or []
    if args.jsonl:
        for r in items:
            print(json.dumps(as_labelled(r), ensure_ascii=False))
    elif args.json:
        print_json(items)
    else:
        for r in items:
            print(
                f"{r.get('reported_at', '')}  {r['job_id']}  {r['label']:<6}  {r.get('kind') or '-':<14}  "
                f"{(r.get('category') or '-'):<16}  {r['prompt'][:60]}"
            )
        print(f"{len(items)} report(s)")
    return EXIT_OK
