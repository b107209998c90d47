"""A host's content-addressed model and data cache with an LRU size limit: an on-prem node's (the agent evicts)
and a Batch GPU instance's (the runtime evicts, :func:`gpufleet.runtime.generate`).

Shared by every job on the node (separate processes), so all coordination is
through the file system. The layout is the one the runtime's model loader
(:mod:`gpufleet.models.loader`) already uses for S3 models, so there is one cache:

``<root>/models/sha256/<sha256>``  a cached file, or a directory (a model snapshot)
``<root>/blobs/<sha256>``          input objects staged by the runtime (:mod:`gpufleet.runtime.staging`);
                                  evicted here like the rest (its index then misses and re-fetches)
``<root>/inputs/<sha256>``         the ``s3://`` URIs (as specs name them) blob ``<sha256>`` was staged for;
                                  removed with the blob
``<root>/locks/<sha256>``          flock: shared while a job uses the entry, exclusive
                                  while it is being filled or evicted
``<root>/stats.json``              hit/miss/eviction counters (updated under ``<root>/.lock``)

Contract:
- Keys are SHA-256 hex digests of the content: a file's bytes, or for a
  directory :func:`tree_sha256` — the SHA-256 of its manifest
  ``{"files": {relpath: sha256}}`` in the loader's canonical JSON, so a folder
  the loader installed and one installed here have the same key. :meth:`ContentCache.put` and
  :meth:`ContentCache.fetch` verify the digest before an entry becomes visible
  (a corrupt download raises :class:`gpufleet.errors.ValidationFailed` and
  leaves nothing behind). Entries are installed by atomic rename.
- Reading an entry (:meth:`get`, :meth:`fetch`) re-verifies it: its content must
  still hash to its key, else it is removed and the read is a miss (``fetch``
  loads it again). A verified read marks it most recently used. The digest is remembered with the entry's files'
  identities (:mod:`gpufleet.runtime.verified`, ``<root>/verified/``): a read re-hashes only
  what changed, and everything once ``reverify_s`` has passed. Eviction removes an entry's record with it.
- Partial writes a killed process left (:data:`PARTIALS`) are removed by every eviction once untouched for
  :data:`STALE_PARTIAL_S` (:meth:`ContentCache.sweep_partials`): they would hold the disk for good.
- After every insertion (and periodically, by the agent) the least recently
  used entries of both areas are evicted until the total size is at most
  ``max_bytes``. Never evicted: an entry pinned by a running job
  (:meth:`pinned`), and an entry used or created less than ``min_age_s`` ago
  (a job may be reading it without a pin). So the cache may exceed the limit
  for a while.
- The runtime finds the cache through ``GPUFLEET_CACHE_DIR`` (set by the agent; on a Batch GPU instance by the
  GPU job definitions, which mount the instance's cache there: infra/compute.py).
- The agent advertises the models it holds by name (:meth:`ContentCache.model_names`), the
  identifier jobs use, not by content hash (:mod:`gpufleet.models.names`), and the inputs it holds by
  their URI (:meth:`ContentCache.input_uris`: the most recently used first, bounded in count and characters).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpufleet.clock import Clock
from gpufleet.errors import BadRequest, ValidationFailed
from gpufleet.models.loader import folder_sha256
from gpufleet.models.names import read_names, recorded_names
from gpufleet.runtime.staging import file_sha256
from gpufleet.runtime.verified import RECORDS, REVERIFY_S, TEMP_PREFIX, Digests

_KEY = re.compile(r"^[0-9a-f]{64}$")
#: (area under the root, name prefix) of what a writer builds before renaming it into place: the loader's downloads
#: (``.dl-``), the stager's blobs (``.part-``), this cache's own installs (``tmp/``, any name) and the tiny model's
#: build (``.tiny-wan-``); a process killed mid-write (SIGKILL, OOM, a spot reclaim) leaves them behind
PARTIALS = (("models/sha256", ".dl-"), ("blobs", ".part-"), ("tmp", ""), ("models", ".tiny-wan-"),
            (RECORDS, TEMP_PREFIX))
#: a partial write untouched this long is abandoned
STALE_PARTIAL_S = 3600.0
ENV_VAR = "GPUFLEET_CACHE_DIR"


def tree_sha256(root: Path) -> str:
    """Digest of a directory: SHA-256 of ``{"files": {relpath: sha256}}`` (dot files skipped),
    canonical JSON — the content hash of :func:`gpufleet.models.loader.folder_manifest`."""
    return folder_sha256(Path(root))


def content_sha256(path: Path) -> str:
    return tree_sha256(path) if Path(path).is_dir() else file_sha256(path)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _mark_complete(staging: Path, key: str) -> None:
    """Directory entries carry the loader's ``.complete`` marker (its readers require it)."""
    if staging.is_dir():
        (staging / ".complete").write_text(key)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class ScrubReport:
    """What :meth:`ContentCache.scrub` found: entries hashed, their bytes, the keys whose content no longer matched
    (``removed``, or ``held``: in use by a running job, left to its next use, which hashes it in full), seconds."""

    entries: int = 0
    bytes: int = 0
    removed: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"entries": self.entries, "bytes": self.bytes, "corrupt": len(self.removed) + len(self.held),
                "removed": list(self.removed), "held": list(self.held), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0


class ContentCache:
    def __init__(self, root: Path | str, max_bytes: int, min_age_s: float = 0.0, *, clock: Clock,
                 reverify_s: float = REVERIFY_S) -> None:
        self.root = Path(root)
        self.clock = clock
        self.digests = Digests(self.root, reverify_s, now=clock.now)
        self.max_bytes = int(max_bytes)
        self.min_age_s = float(min_age_s)
        self.objects = self.root / "models" / "sha256"
        self.blobs = self.root / "blobs"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"
        self.inputs = self.root / "inputs"
        # tmp: same file system, so installs are renames
        for d in (self.objects, self.blobs, self.locks, self.tmp, self.inputs):
            d.mkdir(parents=True, exist_ok=True)

    # locking -------------------------------------------------------------------------------
    @contextmanager
    def _flock(self, path: Path, mode: int, blocking: bool = True) -> Iterator[bool]:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            try:
                fcntl.flock(fd, mode | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def _staging(self, key: str) -> Path:
        """A fresh name in ``tmp`` (same file system as the entries, so installing is a rename)."""
        return self.tmp / f"{key}.{os.getpid()}.{uuid.uuid4().hex}"

    def _check_key(self, key: str) -> None:
        if not _KEY.match(key):
            raise BadRequest(f"cache keys are sha256 hex digests, got {key!r}")

    def _count(self, **inc: int) -> None:
        with self._flock(self.root / ".lock", fcntl.LOCK_EX):
            path = self.root / "stats.json"
            try:
                data = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                data = {}
            for k, v in inc.items():
                data[k] = int(data.get(k, 0)) + v
            tmp = path.with_name(f".stats.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)

    # reading -------------------------------------------------------------------------------
    def path(self, key: str) -> Path:
        self._check_key(key)
        return self.objects / key

    def contains(self, key: str) -> bool:
        return self.path(key).exists()

    def get(self, key: str) -> Path | None:
        """The cached entry (marked most recently used), or None; counts a hit or a miss."""
        p = self.path(key)
        if self._hit(p):
            return p
        self._count(misses=1)
        return None

    def _hit(self, p: Path, locked: bool = False) -> bool:
        """If entry ``p`` exists and still hashes to its key: mark it most recently used, count a hit, True.
        An entry whose content no longer matches is removed (under its exclusive lock) and is a miss."""
        if not p.exists():
            return False
        if not self._intact(p):
            if locked:
                self._drop(p)
            else:
                with self._flock(self.locks / p.name, fcntl.LOCK_EX):
                    if p.exists() and not self._intact(p):
                        self._drop(p)
            return False
        os.utime(p)
        if p.is_file():
            self.digests.touched(p)  # marking a file used changed its times, not its bytes
        self._count(hits=1)
        return True

    def _intact(self, p: Path) -> bool:
        try:
            return self.digests.digest(p, content_sha256) == p.name
        except FileNotFoundError:
            return False

    def _drop(self, p: Path) -> None:
        """Remove entry ``p`` (its caller holds the key's exclusive lock), a blob's URI record and its digest's."""
        _remove(p)
        if p.parent == self.blobs:
            (self.inputs / p.name).unlink(missing_ok=True)  # a blob's URI record goes with it
        self.digests.forget(p)

    @contextmanager
    def pinned(self, key: str) -> Iterator[Path | None]:
        """Hold the entry (if present) so eviction skips it while a job uses it."""
        self._check_key(key)
        with self._flock(self.locks / key, fcntl.LOCK_SH):
            p = self.objects / key
            yield p if p.exists() else None

    def keys(self) -> list[str]:
        return sorted(p.name for p in self.objects.iterdir() if _KEY.match(p.name))

    def model_names(self) -> list[str]:
        """The models this node holds, by the name jobs give them (``spec.workload.model``): the names
        the loader recorded in each cached folder, and the folders it built locally
        (``<root>/models/<name>/model_index.json``, e.g. ``wan-tiny``). What the agent advertises."""
        names: set[str] = set()
        for p in self.objects.iterdir():
            if _KEY.match(p.name) and p.is_dir():
                names.update(recorded_names(p))
        for p in self.objects.parent.iterdir():
            if p.name != self.objects.name and not p.name.startswith(".") and (p / "model_index.json").is_file():
                names.add(p.name)
        return sorted(names)

    def input_uris(self, limit: int, max_chars: int) -> list[str]:
        """The input URIs this node's blobs hold (recorded by :mod:`gpufleet.runtime.staging`), most recently
        used blob first, at most ``limit`` of them and ``max_chars`` characters together (what does not fit
        is left out: the least recently used). A record whose blob is gone is skipped. What the agent
        advertises as the node's ``datasets``."""
        used: list[tuple[float, str]] = []
        for rec in self.inputs.iterdir():
            if not _KEY.match(rec.name):
                continue
            try:
                used.append(((self.blobs / rec.name).stat().st_mtime, rec.name))
            except FileNotFoundError:
                continue
        out: dict[str, None] = {}
        chars = 0
        for _, key in sorted(used, reverse=True):
            for uri in read_names(self.inputs / key):
                if len(out) >= limit:
                    return list(out)
                if uri in out or chars + len(uri) > max_chars:
                    continue
                out[uri] = None
                chars += len(uri)
        return list(out)

    def stats(self) -> CacheStats:
        try:
            data = json.loads((self.root / "stats.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            data = {}
        entries = self._entries()
        return CacheStats(
            hits=int(data.get("hits", 0)),
            misses=int(data.get("misses", 0)),
            evictions=int(data.get("evictions", 0)),
            bytes=sum(_size(p) for p in entries),
            entries=len(entries),
        )

    def _entries(self) -> list[Path]:
        return [p for area in (self.objects, self.blobs) for p in area.iterdir() if _KEY.match(p.name)]

    # writing -------------------------------------------------------------------------------
    def put(self, key: str, src: Path, move: bool = False) -> Path:
        """Install ``src`` (file or directory) under ``key`` after verifying its digest."""
        dest = self.path(key)
        got = content_sha256(Path(src))
        if got != key:
            raise ValidationFailed(f"cache entry digest mismatch: expected {key}, got {got}")
        with self._flock(self.locks / key, fcntl.LOCK_EX):
            if not dest.exists():
                staging = self._staging(key)
                if move:
                    os.replace(src, staging)
                elif Path(src).is_dir():
                    shutil.copytree(src, staging)
                else:
                    shutil.copyfile(src, staging)
                _mark_complete(staging, key)
                os.replace(staging, dest)
        self.evict(keep=key)
        return dest

    def fetch(self, key: str, loader: Callable[[Path], None]) -> tuple[Path, bool]:
        """Return ``(path, hit)``: the entry, loading it with ``loader(tmp_path)`` on a miss.

        Concurrent fetches of the same key load it once: the others wait on the
        key's lock and then hit.
        """
        p = self.path(key)
        if self._hit(p):
            return p, True
        with self._flock(self.locks / key, fcntl.LOCK_EX):
            if self._hit(p, locked=True):
                return p, True
            self._count(misses=1)
            staging = self._staging(key)
            try:
                loader(staging)
                got = content_sha256(staging)
                if got != key:
                    raise ValidationFailed(f"loaded content digest mismatch: expected {key}, got {got}")
                _mark_complete(staging, key)
                os.replace(staging, p)
            finally:
                if staging.is_dir():
                    shutil.rmtree(staging, ignore_errors=True)
                elif staging.exists():
                    staging.unlink()
        self.evict(keep=key)
        return p, False

    def scrub(self) -> ScrubReport:
        """Hash every entry in full now, whatever is remembered (an operator who suspects the disk: a remembered
        digest cannot see bytes that change without a write). An entry that no longer matches its key is removed
        under its exclusive lock, or, held by a running job, has its record forgotten so its next use hashes it
        (and removes it); a matching entry's digest is recorded afresh. Entries are hashed unlocked: they are
        immutable, and one evicted meanwhile is skipped."""
        started = self.clock.now()
        entries = total = 0
        removed: list[str] = []
        held: list[str] = []
        for p in sorted(self._entries()):
            try:
                size = _size(p)
                intact = self.digests.digest(p, content_sha256, force=True) == p.name
            except FileNotFoundError:
                continue
            entries, total = entries + 1, total + size
            if intact:
                continue
            self.digests.forget(p)
            with self._flock(self.locks / p.name, fcntl.LOCK_EX, blocking=False) as got:
                if got:
                    self._drop(p)
                    removed.append(p.name)
                else:
                    held.append(p.name)
        return ScrubReport(entries, total, tuple(removed), tuple(held), self.clock.now() - started)

    def sweep_partials(self, stale_s: float = STALE_PARTIAL_S) -> list[str]:
        """Remove what a killed process left half-written (:data:`PARTIALS`: a download, a staged blob, an install,
        the tiny model's build) once nothing in it changed for ``stale_s``; returns their paths under the root.
        A live writer touches its files as it writes, so only the abandoned go; one whose writer was merely
        stalled that long fails its own write (a transient error: the job runs again)."""
        cutoff = self.clock.now() - stale_s
        removed: list[str] = []
        for area, prefix in PARTIALS:
            folder = self.root / area
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                if not p.name.startswith(prefix):
                    continue
                try:
                    newest = max([p.stat().st_mtime] + ([q.stat().st_mtime for q in p.rglob("*")] if p.is_dir() else []))
                except FileNotFoundError:
                    continue  # its writer finished (renamed it into place) or removed it meanwhile
                if newest < cutoff:
                    _remove(p)
                    removed.append(p.relative_to(self.root).as_posix())
        return removed

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used, unpinned entries until the total is within ``max_bytes`` (and, first,
        stale partial writes: :meth:`sweep_partials`)."""
        removed: list[str] = []
        young = self.clock.now() - self.min_age_s
        with self._flock(self.root / ".evict", fcntl.LOCK_EX):
            self.sweep_partials()
            entries = []
            for p in self._entries():
                try:
                    st = p.stat()
                    entries.append((max(st.st_mtime, st.st_atime if p.is_file() else 0.0), str(p), _size(p)))
                except FileNotFoundError:
                    continue
            total = sum(e[2] for e in entries)
            for used, path, size in sorted(entries):
                if total <= self.max_bytes:
                    break
                p = Path(path)
                key = p.name
                if key == keep or used > young:
                    continue
                with self._flock(self.locks / key, fcntl.LOCK_EX, blocking=False) as got:
                    if not got:
                        continue  # pinned by a running job
                    self._drop(p)
                    total -= size
                    removed.append(key)
            self.digests.sweep()  # records of entries removed another way (a loader's corrupt copy, by hand)
        if removed:
            self._count(evictions=len(removed))
        return removed
