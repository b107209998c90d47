"""Resolve a model name to a local ``WanPipeline`` folder and load it.

Contract:
- ``wan-tiny`` is built offline into ``<cache_dir>/models/wan-tiny``.
- With ``local_root``, ``<local_root>/<name>/model_index.json`` is used as is.
- With ``s3_root`` (``s3://bucket/prefix/``), the model is published as
  ``<prefix><name>/manifest.json`` (``{"files": {relpath: sha256}}``) plus its
  files. The manifest's SHA-256 is the model's content hash; the folder is
  cached under ``<cache_dir>/models/sha256/<hash>`` (shared by jobs on a node),
  every file is verified against the manifest, and the folder appears
  atomically (download to temp, then rename). A cache hit moves no bytes and
  refreshes the folder's timestamps, so the agent's eviction is least-recently-used.
  Every hit is re-verified: the folder's files must still hash to the manifest
  (the folder's manifest SHA-256 equals the content hash); a folder that does not
  is removed and downloaded again — unless the caller says the model is loaded in its process already
  (``resolve(name, loaded)``, a warm worker): then only the manifest is read.
  A folder's digest is remembered with its files' identities (:mod:`gpufleet.runtime.verified`): after the first
  hit, a hit re-hashes only when a file changed or the last full hash is older than ``reverify_s`` (a day). The
  same holds for a local or built-in model's content hash.
- Each cached folder records the model name(s) it was resolved from
  (:mod:`gpufleet.models.names`), so the agent advertises models by the name the spec uses.
- A download holds ``<cache_dir>/locks/<hash>`` exclusively (the node cache's per-key lock,
  :mod:`gpufleet.runtime.hostcache`) and looks for the folder again once it has it: a job starting while the agent
  prefetches its model (:meth:`ModelLoader.prefetch`) waits for that download and hits.
- :meth:`ModelLoader.prefetch` fetches a published model into the cache and nothing else: a local or
  built-in model has nothing to fetch (None); ``stop()`` is asked before each file, and a stopped
  prefetch leaves nothing behind (:class:`Stopped`).
- An unknown model raises :class:`gpufleet.errors.NotFound`; a file whose hash
  does not match raises :class:`gpufleet.errors.TransientError`.
- ``resolve(name, loaded, expect=hash)``: the job's pinned content hash (``model_hash``, from the model catalog at
  submission: :mod:`gpufleet.store.model_catalog`). A model whose content hash is another — its published manifest
  (checked before any file moves), or a local root's folder — raises :class:`ModelChanged` (a user error: the job
  fails without retries, its GPU never loads anything else).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import NotFound, TransientError, ValidationFailed
from gpufleet.models.names import record_name
from gpufleet.models.tiny_wan import MODEL_CONSTRUCTION_LOCK, TINY_MODEL_NAME, save_tiny_wan
from gpufleet.runtime.staging import file_sha256, files_sha256, mark_used
from gpufleet.runtime.verified import REVERIFY_S, Digests, content_files
from gpufleet.store.objectstore import ObjectStore, parse_s3_uri, sha256_hex


class ModelChanged(ValidationFailed):
    """The model's content is not the hash the job pinned at submission (re-published or re-registered since)."""

    @classmethod
    def of(cls, name: str, expect: str, found: str) -> ModelChanged:
        return cls(f"model {name!r} is no longer the content this job was submitted with (pinned {expect[:12]}, "
                   f"found {found[:12]}): submit it again to run the model as registered now", field="workload.model")


def _check_pin(name: str, expect: str | None, found: str) -> None:
    if expect is not None and found != expect:
        raise ModelChanged.of(name, expect, found)


class Stopped(Exception):
    """A prefetch was told to stop (its job was released or fenced) before it finished."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    content_hash: str  # sha256 of the manifest (S3) or of the folder's files (local)
    bytes_downloaded: int = 0


def folder_manifest(folder: Path) -> dict[str, dict[str, str]]:
    """``{"files": {relpath: sha256}}`` of a folder's files (dot files skipped), each streamed, several at once."""
    paths = content_files(Path(folder))
    return {"files": {p.relative_to(folder).as_posix(): d for p, d in zip(paths, files_sha256(paths), strict=True)}}


def manifest_bytes(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def folder_sha256(folder: Path) -> str:
    """A model folder's content hash: the SHA-256 of its manifest (what a published model's manifest.json hashes to)."""
    return sha256_hex(manifest_bytes(folder_manifest(folder)))


def publish_model(folder: str | os.PathLike, store: ObjectStore, s3_root: str, name: str) -> str:
    """Upload a model folder and its manifest under ``s3_root``; returns the content hash."""
    bucket, prefix, _ = parse_s3_uri(s3_root)
    folder = Path(folder)
    manifest = folder_manifest(folder)
    for rel in manifest["files"]:
        store.put_bytes(bucket, f"{prefix}{name}/{rel}", (folder / rel).read_bytes())
    data = manifest_bytes(manifest)
    store.put_bytes(bucket, f"{prefix}{name}/manifest.json", data, content_type="application/json")
    return sha256_hex(data)


@dataclass(frozen=True)
class PublishedModel:
    name: str
    content_hash: str
    files: int
    bytes: int


def published_models(store: ObjectStore, s3_root: str) -> list[PublishedModel]:
    """The models published under ``s3_root`` (a folder with a ``manifest.json``), by name; each with its content
    hash (the manifest's SHA-256), and the count and size of the files its manifest names."""
    bucket, prefix, _ = parse_s3_uri(s3_root)
    sizes: dict[str, dict[str, int]] = {}
    for key, size in store.list_keys(bucket, prefix):
        name, _, rel = key[len(prefix):].partition("/")
        if rel:
            sizes.setdefault(name, {})[rel] = size
    out = []
    for name, files in sorted(sizes.items()):
        if "manifest.json" not in files:
            continue  # files without a manifest: an upload in progress, or a removal's leftovers
        raw = store.get_bytes(bucket, f"{prefix}{name}/manifest.json")
        named = json.loads(raw).get("files", {})
        out.append(PublishedModel(name, sha256_hex(raw), len(named), sum(files.get(rel, 0) for rel in named)))
    return out


def unpublish_model(store: ObjectStore, s3_root: str, name: str) -> int:
    """Remove published model ``name``: its manifest first (a job resolving the name from then on finds no model,
    never a half-removed one), then every file under its folder. Returns the files removed besides the manifest;
    NotFound when nothing is published under that name."""
    bucket, prefix, _ = parse_s3_uri(s3_root)
    folder = f"{prefix}{name}/"
    if not store.exists(bucket, folder + "manifest.json"):
        raise NotFound(f"no model {name!r} is published under {s3_root}")
    store.delete(bucket, folder + "manifest.json")
    removed = 0
    for key, _ in list(store.list_keys(bucket, folder)):
        store.delete(bucket, key)
        removed += 1
    return removed


class ModelLoader:
    def __init__(self, cache_dir: str | os.PathLike, store: ObjectStore | None = None,
                 local_root: str | None = None, s3_root: str | None = None, *, reverify_s: float = REVERIFY_S) -> None:
        self.cache_dir = Path(cache_dir)
        self.digests = Digests(self.cache_dir, reverify_s)
        self.store = store
        self.local_root = Path(local_root) if local_root else None
        self.s3_root = s3_root

    def resolve(self, name: str, loaded: Callable[[str, str], bool] | None = None, *,
                expect: str | None = None) -> ResolvedModel:
        """``name``'s folder and content hash. ``loaded(name, hash)``: whether that model is already loaded in
        this process (a warm worker); a published model that is needs only its manifest: its cached folder
        is neither re-verified nor fetched (what runs is in memory, verified when it was loaded). ``expect``: the
        job's pinned content hash (see module: :class:`ModelChanged`)."""
        if "/" in name or name.startswith("."):
            raise NotFound(f"model {name!r} is not a valid model name")
        if self.local_root and (self.local_root / name / "model_index.json").exists():
            path = self.local_root / name
            found = self.digests.digest(path, folder_sha256)
            _check_pin(name, expect, found)
            return ResolvedModel(name, path, found)
        if self.s3_root and self.store is not None:
            return self._from_s3(name, loaded, expect=expect)
        if name == TINY_MODEL_NAME:
            path = save_tiny_wan(self.cache_dir / "models" / TINY_MODEL_NAME)
            return ResolvedModel(name, path, self.digests.digest(path, folder_sha256))
        raise NotFound(f"model {name!r} not found")

    def prefetch(self, name: str, stop: Callable[[], bool] = lambda: False, *,
                 expect: str | None = None) -> ResolvedModel | None:
        """Fetch published model ``name`` into the cache (see module); None when there is nothing to fetch.
        ``expect``: the job's pinned content hash: other content is not fetched (:class:`ModelChanged`)."""
        if "/" in name or name.startswith("."):
            raise NotFound(f"model {name!r} is not a valid model name")
        if self.local_root and (self.local_root / name / "model_index.json").exists():
            return None
        if not (self.s3_root and self.store is not None):
            return None
        return self._from_s3(name, None, stop=stop, build=False, expect=expect)

    def _from_s3(self, name: str, loaded: Callable[[str, str], bool] | None = None, *,
                 stop: Callable[[], bool] = lambda: False, build: bool = True,
                 expect: str | None = None) -> ResolvedModel | None:
        bucket, prefix, _ = parse_s3_uri(self.s3_root)
        try:
            raw = self.store.get_bytes(bucket, f"{prefix}{name}/manifest.json")
        except NotFound:
            if name == TINY_MODEL_NAME:
                if not build:
                    return None
                path = save_tiny_wan(self.cache_dir / "models" / TINY_MODEL_NAME)
                return ResolvedModel(name, path, self.digests.digest(path, folder_sha256))
            raise NotFound(f"model {name!r} not found under {self.s3_root}")
        digest = sha256_hex(raw)
        _check_pin(name, expect, digest)  # before a byte of the model moves
        dest = self.cache_dir / "models" / "sha256" / digest
        if loaded is not None and loaded(name, digest):
            mark_used(dest)
            return ResolvedModel(name, dest, digest, 0)
        hit = self._cached(name, dest, digest)
        if hit is not None:
            return hit
        dest.parent.mkdir(parents=True, exist_ok=True)
        locks = self.cache_dir / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / digest, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            hit = self._cached(name, dest, digest)  # fetched by another job (or the agent's prefetch) meanwhile
            if hit is not None:
                return hit
            moved = self._download(name, bucket, prefix, json.loads(raw)["files"], dest, digest, stop)
        return ResolvedModel(name, dest, digest, moved)

    def _cached(self, name: str, dest: Path, digest: str) -> ResolvedModel | None:
        """The verified cached folder (a hit, marked used and named), else None; a corrupt one is removed."""
        if (dest / ".complete").exists():
            try:
                same = self.digests.digest(dest, folder_sha256) == digest
            except FileNotFoundError:
                return None  # evicted meanwhile: a miss
            if same and mark_used(dest):
                record_name(dest, name)
                return ResolvedModel(name, dest, digest, 0)
            shutil.rmtree(dest, ignore_errors=True)  # tampered with or corrupt: fetch it again
            self.digests.forget(dest)
        return None

    def _download(self, name: str, bucket: str, prefix: str, files: dict[str, str], dest: Path, digest: str,
                  stop: Callable[[], bool]) -> int:
        tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=dest.parent))
        moved = 0
        try:
            for rel, want in files.items():
                if stop():
                    raise Stopped(f"prefetch of model {name} stopped")
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as fh:
                    moved += self.store.download_to(bucket, f"{prefix}{name}/{rel}", fh)
                if file_sha256(target) != want:
                    raise TransientError(f"model file {rel} of {name} does not match its manifest hash")
            (tmp / ".complete").write_text(digest)
            record_name(tmp, name)
            try:
                os.rename(tmp, dest)
            except OSError:
                if not (dest / ".complete").exists():
                    raise
                record_name(dest, name)  # another job's copy won the rename
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return moved


def load_pipeline(path: str | os.PathLike, device: str = "cpu"):
    """Load a saved ``WanPipeline`` from a local folder (offline; float32), moved to ``device``."""
    import diffusers
    import transformers
    from diffusers import WanPipeline

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    with MODEL_CONSTRUCTION_LOCK:  # its modules are built under process-wide hooks (see the lock)
        pipe = WanPipeline.from_pretrained(str(path), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if device != "cpu":
        pipe.to(device)
    return pipe
