"""Container-image Lambdas: the Docker image asset of a :class:`~infra.config.FunctionDef` with ``image`` set.

Contract:
- The build context is the repository root filtered by the Dockerfile's own ignore file
  (``<Dockerfile>.dockerignore``, which BuildKit applies to a hand-run
  ``docker build -f <Dockerfile> .``); :func:`image_code` passes the same patterns to the CDK asset
  (``IgnoreMode.DOCKER``), so the staged asset holds exactly what a manual build sends.
- The image's command is ``[FunctionDef.handler]`` (``ImageConfig.Command`` in the template); the
  Dockerfile's own ``CMD`` names the same handler (checked by tests/infra).
- Images are built for ``linux/amd64`` and the function runs on ``IMAGE_ARCHITECTURE`` (x86_64).
- The base image is the Lambda Python image of ``IMAGE_PYTHON`` (Amazon Linux 2023, glibc
  ``IMAGE_GLIBC``): the binary wheels the image installs (torch, numpy) are manylinux_2_27/2_28, which
  the Python 3.11 image (Amazon Linux 2, glibc 2.26) cannot install. The image brings its own
  interpreter and wheels, so it need not match the zip functions' ``LAMBDA_RUNTIME``.
- Synthesis only stages the build context (no Docker engine); ``cdk deploy`` (cdk-assets) builds the
  image and pushes it to the bootstrap ECR repository.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_lambda as lambda_

from gpufleet.errors import ConfigError
from infra.config import FunctionDef

REPO_ROOT = Path(__file__).resolve().parents[1]
IMAGE_ARCHITECTURE = lambda_.Architecture.X86_64
IMAGE_PLATFORM = ecr_assets.Platform.LINUX_AMD64
#: Python of the Lambda base image (``public.ecr.aws/lambda/python:<IMAGE_PYTHON>``) and its glibc.
IMAGE_PYTHON = "3.12"
IMAGE_GLIBC = (2, 34)


def ignore_file(dockerfile: str) -> Path:
    """The Dockerfile-specific ignore file (``<path>.dockerignore``) of ``dockerfile`` (repository-relative)."""
    return REPO_ROOT / f"{dockerfile}.dockerignore"


def ignore_patterns(dockerfile: str) -> list[str]:
    """The build-context patterns of ``dockerfile`` (comments and blank lines dropped)."""
    path = ignore_file(dockerfile)
    if not path.is_file():
        raise ConfigError(f"{dockerfile}: no {path.name} next to it (the build context would be the whole repository)")
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def image_code(d: FunctionDef) -> lambda_.DockerImageCode:
    """The image asset of ``d`` (``d.image`` is the Dockerfile, repository-relative) running ``d.handler``."""
    if not d.image:
        raise ConfigError(f"function {d.key} is not a container-image function")
    if not (REPO_ROOT / d.image).is_file():
        raise ConfigError(f"function {d.key}: {d.image} is missing")
    return lambda_.DockerImageCode.from_image_asset(
        str(REPO_ROOT),
        file=d.image,
        cmd=[d.handler],
        exclude=ignore_patterns(d.image),
        ignore_mode=IgnoreMode.DOCKER,
        platform=IMAGE_PLATFORM,
    )
