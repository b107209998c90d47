"""One synthesized cloud assembly per test session (synth takes seconds), shared by the template tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.local.synth import synthesize, template


@pytest.fixture(scope="session")
def assembly_dir() -> Path:
    return synthesize()


@pytest.fixture(scope="session")
def tpl(assembly_dir: Path) -> dict:
    return template(assembly_dir)


@pytest.fixture(scope="session")
def metadata(assembly_dir: Path) -> dict:
    from infra.config import STACK_NAME

    return json.loads((assembly_dir / f"{STACK_NAME}.metadata.json").read_text())
