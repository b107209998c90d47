"""Assemble the one Lambda asset folder (``build/lambda``) without Docker.

Contract:
- :func:`build_lambda_asset` copies the ``gpufleet`` and ``lambdas`` packages
  (source and package data only) and the installed files of the runtime
  dependencies (Powertools, pydantic and what they require, but not boto3,
  which the Lambda runtime provides) into ``<root>/build/lambda`` and returns
  that path; ``Code.from_asset`` points at it.
- The build is skipped when a fingerprint of every input (path, size, mtime)
  is unchanged; a file lock makes concurrent builds (parallel test workers)
  safe, and the folder is replaced atomically.
- Binary wheels come from this interpreter, so the Lambda runtime must match
  it (CPython 3.11, x86_64 Linux): see ``LAMBDA_RUNTIME`` in infra/functions.py. CheckPrompt does
  not run from this asset: it is a container image (infra/lambda_image.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as md
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpufleet.errors import ConfigError

#: Top-level distributions bundled into the asset (their requirements are followed).
BUNDLED_DISTRIBUTIONS = ("aws-lambda-powertools", "pydantic", "pydantic-settings", "numpy", "reedsolo")
#: Provided by the Lambda Python runtime; never bundled.
RUNTIME_PROVIDED = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six"})
#: Source packages of this repository copied into the asset.
SOURCE_PACKAGES = ("gpufleet", "lambdas")
#: Sub-trees of the source packages that never run in Lambda.
EXCLUDED_SOURCE = ("gpufleet/local", "gpufleet/safety/face_api")  # face_api: finalize's weights, not a function's
_DATA_SUFFIXES = {".py", ".json", ".toml", ".txt"}

REPO_ROOT = Path(__file__).resolve().parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(roots: Iterable[str] = BUNDLED_DISTRIBUTIONS) -> list[md.Distribution]:
    """The installed distributions reachable from ``roots`` (no extras), minus the runtime-provided ones."""
    seen: dict[str, md.Distribution] = {}
    todo = [_norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in RUNTIME_PROVIDED:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as exc:
            raise ConfigError(f"Lambda asset needs {name!r}, which is not installed") from exc
        seen[name] = dist
        for req in dist.requires or []:
            if ";" in req and "extra ==" in req.split(";", 1)[1]:
                continue
            marker = req.split(";", 1)[1] if ";" in req else ""
            if "platform_system == 'Windows'" in marker or 'sys_platform == "win32"' in marker:
                continue
            todo.append(_norm(re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0]))
    return [seen[k] for k in sorted(seen)]


def _source_files(root: Path) -> Iterator[tuple[Path, str]]:
    for pkg in SOURCE_PACKAGES:
        base = root / pkg
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or "__pycache__" in path.parts or path.suffix not in _DATA_SUFFIXES:
                continue
            if any(rel == ex or rel.startswith(ex + "/") for ex in EXCLUDED_SOURCE):
                continue
            yield path, rel


def _dist_files(dists: Iterable[md.Distribution]) -> Iterator[tuple[Path, str]]:
    for dist in dists:
        for f in dist.files or []:
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc") or ".dist-info/" in rel:
                continue
            if rel.startswith("bin/"):
                continue
            src = Path(str(f.locate()))
            if src.is_file():
                yield src, rel


def asset_inputs(root: Path = REPO_ROOT) -> list[tuple[Path, str]]:
    """Every (source file, path inside the asset) pair, in a stable order."""
    return sorted([*_source_files(root), *_dist_files(dependency_closure())], key=lambda x: x[1])


def fingerprint(inputs: list[tuple[Path, str]]) -> str:
    h = hashlib.sha256()
    for src, rel in inputs:
        st = src.stat()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def build_lambda_asset(root: Path = REPO_ROOT, out: Path | None = None) -> Path:
    """Build (or reuse) the asset folder and return its path."""
    out = out or root / "build" / "lambda"
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.parent / ".lambda-asset.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        inputs = asset_inputs(root)
        digest = fingerprint(inputs)
        stamp = out / ".fingerprint"
        if stamp.is_file() and stamp.read_text() == digest:
            return out
        tmp = out.parent / f".lambda-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for src, rel in inputs:
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        (tmp / ".fingerprint").write_text(digest)
        old = out.parent / f".lambda-old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(build_lambda_asset())
