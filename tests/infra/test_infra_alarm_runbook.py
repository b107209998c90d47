"""Every alarm that pages (an alarm action, or a composite SLO alarm) has a row in the runbook of
docs/operations.md ("Alarms and SLOs: the runbook") saying what it means and what to do: an operator paged by an
alarm the runbook does not name has nothing to go on."""

from __future__ import annotations

import re
from pathlib import Path

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _paging_alarms(tpl: dict) -> set[str]:
    """The construct ids of the paging alarms (logical id without the construct's prefix and CDK's hash)."""
    out = set()
    for lid, r in tpl["Resources"].items():
        if r["Type"] == "AWS::CloudWatch::CompositeAlarm" or (
                r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("AlarmActions")):
            out.add(re.sub(r"^Observability|[0-9A-F]{8}$", "", lid))
    return out


def _runbook_names() -> list[str]:
    text = RUNBOOK.read_text()
    section = text[text.index("## Alarms and SLOs: the runbook"):]
    section = section[:section.index("\n## ", 5)]
    names = []
    for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE):
        names += re.findall(r"`([^`]+)`", row)
    return names


def _covered(alarm: str, names: list[str]) -> bool:
    return any(re.fullmatch(re.sub(r"<\w+>", "[A-Za-z0-9]+", re.escape(n).replace(r"\<", "<").replace(r"\>", ">")),
                            alarm) for n in names)


def test_every_paging_alarm_has_a_runbook_row(tpl):
    alarms, names = _paging_alarms(tpl), _runbook_names()
    assert len(alarms) >= 15 and "ProvenanceLookupErrors" in alarms and "QueueWaitSloOnpremA" in alarms
    assert not {a for a in alarms if not _covered(a, names)}, "alarms the runbook does not name"
    # and the runbook names no alarm the template lacks (a pattern row must match one at least)
    assert not [n for n in names if not any(_covered(a, [n]) for a in alarms)], "runbook rows without an alarm"
