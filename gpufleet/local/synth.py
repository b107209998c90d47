"""Synthesize the CDK app once and share the cloud assembly between processes.

Contract:
- :func:`synthesize` returns the directory of a cloud assembly for ``context``
  (merged over :data:`LOCAL_CONTEXT`), reusing ``build/cdk/<key>`` when the key
  (context + path, size and mtime of every file under infra/, gpufleet/, lambdas/ and of the
  top-level files the image build contexts hold) is unchanged. A file
  lock makes parallel test workers wait for one synth instead of running two;
  assemblies unused for an hour are pruned.
- :data:`LOCAL_CONTEXT` holds test-sized timeouts; tests and the dev stack use
  it, production deploys use the defaults of infra/config.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "build" / "cdk"
_INPUT_TREES = ("infra", "gpufleet", "lambdas")
#: Top-level files in an image asset's build context (its hash, hence the template, depends on them).
_INPUT_FILES = ("pyproject.toml", "constraints.txt", "README.md")

#: Second-sized timeouts and throw-away resources for local runs. The GPU image and the CheckPrompt
#: Lambda image stay Docker image assets as in production (synthesis stages their build contexts
#: without Docker); the local deploy never builds them: the local Batch runner runs
#: ``python -m gpufleet.runtime`` itself and the Lambda runner runs CheckPrompt's handler in-process.
LOCAL_CONTEXT: dict[str, Any] = {
    "gpufleet:removal": "destroy",
    "gpufleet:bucket_prefix": "gpufleet",
    "gpufleet:heartbeat_seconds": 3,
    "gpufleet:cloud_heartbeat_seconds": 10,  # a local supervisor starts in seconds (no capacity or image pull)
    "gpufleet:placement_timeout_seconds": 120,
    "gpufleet:run_timeout_seconds": 120,
    "gpufleet:finalize_timeout_seconds": 60,
    "gpufleet:finalize_retry_interval_seconds": 1,
    # a finalize that fails every try waits 1 + 1 s here, not 1 + 2 + 4 s (the suite runs several)
    "gpufleet:finalize_retry_backoff_rate": 1,
    # FinalizeRoute's bound at test size: 5-frame clips at 256x256 (delivered) finalize in FinalizeLambda, larger
    # ones in the CPU Batch job, so local stacks exercise both (the dev stack sets the deployment default back,
    # gpufleet.devstack.settings); one context for the template tests and the control-plane survey: one synth
    "gpufleet:finalize_lambda_max_pixels": 6 * 256 * 256,
    "gpufleet:nat_gateways": 0,
    # The dev stack and the e2e suite deliver webhooks to a loopback receiver.
    "gpufleet:webhook_allow_private": True,
}


def _inputs_key(context: Mapping[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(dict(context), sort_keys=True).encode())
    paths = [REPO_ROOT / f for f in _INPUT_FILES if (REPO_ROOT / f).is_file()]
    for tree in _INPUT_TREES:
        paths += sorted(p for p in (REPO_ROOT / tree).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in paths:
        st = path.stat()
        h.update(f"{path.relative_to(REPO_ROOT)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


_PROCESS_CACHE: dict[str, Path] = {}


def synthesize(context: Mapping[str, Any] | None = None, *, cache_dir: Path = CACHE_DIR) -> Path:
    """Return the cloud assembly directory for ``LOCAL_CONTEXT | context`` (cached).

    Within one process the first assembly for a context is reused even if sources change
    afterwards, so every test of a session sees the same template.
    """
    merged = {**LOCAL_CONTEXT, **(context or {})}
    ctx_key = json.dumps(merged, sort_keys=True)
    known = _PROCESS_CACHE.get(ctx_key)
    if known is not None and (known / "manifest.json").is_file():
        return known
    _PROCESS_CACHE[ctx_key] = out = _synthesize(merged, cache_dir)
    return out


def _synthesize(merged: dict[str, Any], cache_dir: Path) -> Path:
    key = _inputs_key(merged)
    out = cache_dir / key
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "manifest.json").is_file():
            os.utime(out)
            return out
        tmp = cache_dir / f".{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        from infra.app import synth

        try:
            synth(merged, outdir=str(tmp))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        tmp.rename(out)
        _prune(cache_dir, keep=key)
    return out


def _prune(cache_dir: Path, keep: str, max_age_s: float = 3600.0) -> None:
    """Drop assemblies unused for ``max_age_s`` (others may still be deploying a recent one)."""
    now = time.time()
    for old in cache_dir.iterdir():
        if old.is_dir() and old.name != keep and not old.name.startswith(".") and now - old.stat().st_mtime > max_age_s:
            shutil.rmtree(old, ignore_errors=True)


def template(assembly_dir: Path, stack_name: str | None = None) -> dict[str, Any]:
    """The synthesized template of ``stack_name`` (default: the app's stack)."""
    from infra.config import STACK_NAME

    return json.loads((assembly_dir / f"{stack_name or STACK_NAME}.template.json").read_text())
