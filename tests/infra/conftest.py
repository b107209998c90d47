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


@pytest.fixture(scope="session")
def survey(assembly_dir: Path, tmp_path_factory):
    """Every AWS call of each control-plane function, recorded on the deployed stack (control_plane_survey)."""
    import os

    from control_plane_survey import survey as run

    from gpufleet.local import oci_image
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME, save_tiny_wan

    # the survey runs a container job through the real container stage where rootless podman runs; elsewhere
    # every other scenario still runs and the container-only functions' tests skip, saying why
    reason = oci_image.local_oci_unavailable()

    cache = tmp_path_factory.mktemp("survey-cache")
    save_tiny_wan(cache / "models" / TINY_MODEL_NAME)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_REGION": "us-east-1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        assert os.environ["AWS_REGION"] == "us-east-1"
        found = run(cache, tmp_path_factory.mktemp("survey-work"), containers=reason is None)
        found.containers_unavailable = reason
        return found
