"""Every `docs/<file>.md "Section"` the repository cites names a heading that exists in that file.

Code, tests and docs point readers (and the acceptance of a test's recorded figures) at sections of
docs/; a rewrite that drops or renames a section must fail here, not leave the citations dangling.
A citation matches a heading, or a paragraph's or list item's bold lead, that starts with it ("Embedded stack" cites
"Embedded stack: admission …").
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r'docs/([a-z_-]+\.md),? ["“]([^"”\n]{3,160})["”]')
#: a heading, or a paragraph or list item led by a bold title ("**Node reports.** …", "- **Admission** (…)"),
#: which the docs also cite
HEADING = re.compile(r"^(?:#{1,6}\s+(.*?)\s*|(?:[-*]\s+)?\*\*([^*\n]+)\*\*.*)$", re.MULTILINE)


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml", "*.js", "*.ts", "*.html", "Makefile"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if line]


def _plain(text: str) -> str:
    """A heading or citation without Markdown code marks, so "`POST /v1/jobs`" and "POST /v1/jobs" match."""
    return text.replace("`", "").strip()


@cache
def _headings(doc: str) -> tuple[str, ...]:
    path = ROOT / "docs" / doc
    if not path.exists():
        return ()
    return tuple(_plain(heading or lead) for heading, lead in HEADING.findall(path.read_text()))


def citations() -> list[tuple[str, str, str]]:
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for doc, section in CITATION.findall(text):
            found.append((str(path.relative_to(ROOT)), doc, _plain(section)))
    return found


def test_every_cited_docs_section_exists():
    cited = citations()
    assert len(cited) > 50  # the scan sees the repository's citations (dozens today)
    dangling = sorted(
        {(src, doc, section) for src, doc, section in cited
         if not any(h.startswith(section) for h in _headings(doc))}
    )
    assert not dangling, "citations of docs sections that do not exist:\n" + "\n".join(
        f"  {src}: docs/{doc} \"{section}\"" for src, doc, section in dangling
    )


def test_the_citation_and_heading_patterns():
    text = "see docs/api.md, \"Costs\" and docs/benchmarks.md \u201cRuntime: batching\u201d."
    assert CITATION.findall(text) == [("api.md", "Costs"), ("benchmarks.md", "Runtime: batching")]
    doc = "# Title\n### `POST /v1/jobs` \u2014 submission\n**Node reports.** text\n- **Admission** (x)\nplain **bold**\n"
    leads = [_plain(h or b) for h, b in HEADING.findall(doc)]
    assert leads == ["Title", "POST /v1/jobs \u2014 submission", "Node reports.", "Admission"]
