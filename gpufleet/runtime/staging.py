"""Stage a job's inputs to local disk through a content-addressed cache shared by jobs on a node.

Contract:
- ``stage(uris, dest)`` copies each ``s3://bucket/key[?versionId=v]`` to
  ``dest/<basename>`` and returns :class:`StagingReport` (bytes moved over the
  network, bytes served from cache, seconds, per-input sha256).
- Cache layout under ``cache_dir``: ``blobs/<sha256>`` (content-addressed,
  written to a temp file then renamed) and ``index/<sha256(uri|etag|version)>``
  naming the blob. A second job on the node asking for the same object version
  moves no bytes (the object's ETag/version is checked with a HEAD).
- Concurrent stagers on a node are serialised per object with ``fcntl`` locks.
- A cache hit refreshes the blob's timestamps (:func:`mark_used`): the agent's
  eviction (:mod:`gpufleet.runtime.hostcache`) removes the least recently used entries.
- Every hit is re-verified: the blob must still hash to its name. A blob that does not (tampered with, or
  corrupted on disk) is removed and the object is fetched again, as on a miss. The digest is remembered with the
  blob's identity (:mod:`gpufleet.runtime.verified`): a hit hashes the blob again only if it changed or its last
  full hash is older than ``reverify_s``. Blobs are read-only (0444) and
  reach a job's input directory as hard links that the container mounts read-only.
- Every stage (hit or miss) records the URI, as given (the spec's identifier, ``?versionId=`` included), in
  ``inputs/<sha256>`` (a JSON list: a blob may hold several URIs' content), so the agent can advertise the
  inputs its node holds (:meth:`gpufleet.runtime.hostcache.ContentCache.input_uris`); the index alone cannot say
  (its names are hashes).
- ``prefetch(uris)`` fills the cache only (no input directory): the agent warms a held job's inputs.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.models.names import add_name
from gpufleet.runtime.verified import REVERIFY_S, Digests
from gpufleet.store.objectstore import ObjectStore, parse_s3_uri


def mark_used(path: Path) -> bool:
    """Refresh a cache entry's access and modification times (LRU order); False if it is gone."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read 1 MiB at a time (constant memory, whatever the file's size)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_sha256(paths: Sequence[Path], workers: int | None = None) -> list[str]:
    """Each file's :func:`file_sha256`, several files at once (hashlib releases the interpreter lock while it hashes
    a chunk): a model's shards are verified on every cache hit, while its GPU waits."""
    if len(paths) <= 1:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(workers or min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(file_sha256, paths))


@dataclass
class StagingReport:
    bytes_moved: int = 0
    bytes_cached: int = 0
    seconds: float = 0.0
    inputs: dict[str, str] = field(default_factory=dict)  # uri -> sha256

    def as_item(self) -> dict:
        return {"bytes_moved": self.bytes_moved, "bytes_cached": self.bytes_cached,
                "seconds": round(self.seconds, 3), "inputs": dict(self.inputs)}


class Stager:
    def __init__(self, objects: ObjectStore, cache_dir: str | os.PathLike, *, reverify_s: float = REVERIFY_S) -> None:
        self.objects = objects
        self.cache = Path(cache_dir)
        self.digests = Digests(self.cache, reverify_s)
        (self.cache / "blobs").mkdir(parents=True, exist_ok=True)
        (self.cache / "index").mkdir(parents=True, exist_ok=True)
        (self.cache / "locks").mkdir(parents=True, exist_ok=True)
        (self.cache / "inputs").mkdir(parents=True, exist_ok=True)

    def _verified(self, blob: Path, digest: str) -> bool:
        """True if ``blob`` still hashes to ``digest``; a blob that does not is removed (a miss follows)."""
        try:
            if self.digests.digest(blob, file_sha256) == digest:
                return True
        except FileNotFoundError:
            return False
        blob.unlink(missing_ok=True)
        self.digests.forget(blob)
        return False

    def _index_name(self, uri: str, etag: str, version: str | None) -> str:
        return hashlib.sha256(f"{uri}|{etag}|{version or ''}".encode()).hexdigest()

    def _fetch(self, bucket: str, key: str, version: str | None) -> tuple[str, int]:
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self.cache / "blobs", prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as fh:
                class _Hashing:
                    def write(self, b: bytes) -> None:
                        h.update(b)
                        fh.write(b)

                n = self.objects.download_to(bucket, key, _Hashing(), version)
            digest = h.hexdigest()
            os.chmod(tmp, 0o444)  # mkstemp made it 0600: jobs read it through a read-only mount
            os.replace(tmp, self.cache / "blobs" / digest)
            return digest, n
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def cached(self, uri: str, report: StagingReport) -> Path:
        """The blob holding ``uri`` in the node cache, fetched on a miss; records the URI on the blob."""
        bucket, key, version = parse_s3_uri(uri)
        head = self.objects.head(bucket, key, version)
        etag = head.get("ETag", "").strip('"')
        name = self._index_name(f"s3://{bucket}/{key}", etag, version or head.get("VersionId"))
        lock_path = self.cache / "locks" / name
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index = self.cache / "index" / name
            digest = index.read_text().strip() if index.exists() else ""
            blob = self.cache / "blobs" / digest if digest else None
            if blob is not None and not self._verified(blob, digest):
                blob = None
            if blob is not None and mark_used(blob):
                self.digests.touched(blob)  # marking it used changed its times, not its bytes
                report.bytes_cached += blob.stat().st_size
            else:
                digest, n = self._fetch(bucket, key, version)
                report.bytes_moved += n
                blob = self.cache / "blobs" / digest
                tmp_index = index.with_suffix(".tmp")
                tmp_index.write_text(digest)
                os.replace(tmp_index, index)
            add_name(self.cache / "inputs" / digest, uri)
        report.inputs[uri] = digest
        return blob

    def stage_one(self, uri: str, dest_dir: Path, report: StagingReport) -> Path:
        blob = self.cached(uri, report)
        target = dest_dir / (Path(parse_s3_uri(uri)[1]).name or blob.name)
        try:
            if target.exists():
                target.unlink()
            os.link(blob, target)
        except OSError:
            shutil.copyfile(blob, target)
        return target

    def prefetch(self, uris: list[str], stop=lambda: False) -> StagingReport:
        """Fill the cache with ``uris`` (no input directory); ``stop()`` is asked before each object."""
        report = StagingReport()
        t0 = time.monotonic()
        for uri in uris:
            if stop():
                break
            self.cached(uri, report)
        report.seconds = time.monotonic() - t0
        return report

    def stage(self, uris: list[str], dest_dir: str | os.PathLike) -> StagingReport:
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        report = StagingReport()
        t0 = time.monotonic()
        for uri in uris:
            self.stage_one(uri, dest, report)
        report.seconds = time.monotonic() - t0
        return report
