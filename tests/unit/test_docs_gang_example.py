"""The gang example in docs/agent.md is the program and the job the gang e2e runs (docs/examples/), word for word."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpufleet.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]


def _blocks(lang: str) -> list[str]:
    text = (ROOT / "docs" / "agent.md").read_text()
    section = text[text.index("## Writing a gang job"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_the_docs_show_the_example_program_and_job_exactly():
    assert _blocks("python")[0] == (ROOT / "docs" / "examples" / "gang_allreduce.py").read_text()
    assert _blocks("json")[0] == (ROOT / "docs" / "examples" / "gang_allreduce.json").read_text()


def test_the_example_job_is_a_valid_two_node_container_gang():
    spec = JobSpec.model_validate(json.loads((ROOT / "docs" / "examples" / "gang_allreduce.json").read_text()))
    assert spec.resources.nodes == 2 and spec.workload.kind == "container"
    assert spec.workload.command == ["python3", "/app/allreduce.py"]
