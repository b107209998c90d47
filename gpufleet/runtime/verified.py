"""Remembered digests of a host cache's entries: a cache hit hashes what changed since it was hashed, not everything.

A cached model (a folder of multi-GB shards) or staged input used to be hashed in full on every hit. On a Batch GPU
instance every job is a fresh container, so every job re-read its whole model while its GPU waited (about 2 s for
5 GB on this project's CPU; a published Wan 1.3B with its text encoder is several times that), and an on-prem
agent's prefetch did the same beside a running job.

Contract:
- :meth:`Digests.digest` returns a path's digest (``compute(path)``: a file's SHA-256, a folder's manifest hash).
  Once computed it is recorded in ``<root>/verified/<sha256 of the absolute path>`` with the identity of every file
  the digest covers (:func:`content_files`): its path under the entry, device, inode, size and modification time in
  nanoseconds. While every file still has that identity, and the digest was computed less than
  ``reverify_s`` ago, the recorded digest is returned without reading the files.
- What invalidates a record: any write or truncation (each sets the file's modification time), ``rename`` over a
  file, a file added or removed, a re-created file system (inode, device or the file list), ``utime``. Not the
  change time (ctime): a hard link to a blob in a job's input folder, and its removal when the job ends, change it
  without changing a byte (as git's ``core.trustctime=false``). Only a deliberate ``utime`` back to the old time
  after a same-size write passes unseen: an attacker with the cache's permissions (see the last point).
- A record is kept only if nothing changed while the digest was computed (identities read before and after), and
  only if no file changed within :data:`RACY_MARGIN_NS` before the hash began (:func:`racy`: a second write within
  one timestamp tick of the first would leave the identity unchanged). So the first use after a download or a
  write hashes in full and records; later uses do not hash.
- What a record cannot see: bytes that change without a write (a failing disk). ``reverify_s`` (default a day) bounds
  how long such a change goes unnoticed: the next hit after it hashes in full. ``reverify_s=0`` hashes on every
  call (the former behaviour).
- :meth:`Digests.touched` re-records an entry's identities after its owner changed its times on purpose (a cache
  hit marks a blob used with ``utime``); the digest and when it was computed are kept. A write within the same tick
  as that ``utime`` would go unseen until the next full hash (``reverify_s``).
- Records are written atomically (a ``.rec-*`` temp file renamed into place; a killed writer's temp file is swept
  with the cache's other partial writes); a record that does not parse, names another path or has another shape is
  ignored and rewritten. A record that cannot be written (a full or read-only cache) is skipped: the next use hashes.
- Records are not a security boundary: whoever can write the cache's entries can write its records. The cache's
  permissions are (on a Batch GPU instance 0700 and the runtime image's uid; on a node the agent's user).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

RECORDS = "verified"
#: a temp record being written (swept as a partial write once stale)
TEMP_PREFIX = ".rec-"
#: how long a remembered digest is trusted before the next use hashes in full (a failing disk's silent change)
REVERIFY_S = 86400.0
#: a digest is recorded only for files whose last change is at least this much older than the hash's start
RACY_MARGIN_NS = 2_000_000_000

Identity = list  # [relpath, st_dev, st_ino, st_size, st_mtime_ns]


def content_files(path: Path) -> list[Path]:
    """The files a digest covers: a folder's files at any depth, dot files skipped, sorted; a file itself."""
    path = Path(path)
    if path.is_dir():
        return [p for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    return [path]


def racy(files: list[Identity], started_ns: int) -> bool:
    """Whether a file changed too close to when hashing began for its identity to vouch for the digest: a write in
    the same timestamp tick as that change (file times are coarse: a few ms) would leave the identity as it was
    (git's "racily clean" entries). Such a digest is not recorded; the next use hashes again."""
    return any(f[4] >= started_ns - RACY_MARGIN_NS for f in files)


def identities(path: Path) -> list[Identity]:
    """Each covered file's identity (see module); FileNotFoundError when the entry or one of its files is gone."""
    path = Path(path)
    out: list[Identity] = []
    for p in content_files(path):
        st = p.stat()
        rel = p.relative_to(path).as_posix() if p != path else "."
        out.append([rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
    if not out and not path.exists():
        raise FileNotFoundError(path)
    return out


class Digests:
    """Recorded digests of entries under a cache root (see module)."""

    def __init__(self, root: Path | str, reverify_s: float = REVERIFY_S, now: Callable[[], float] = time.time) -> None:
        self.dir = Path(root) / RECORDS
        self.reverify_s = float(reverify_s)
        self.now = now

    def _record_path(self, path: Path) -> Path:
        return self.dir / hashlib.sha256(str(Path(path).absolute()).encode()).hexdigest()

    def _read(self, path: Path) -> dict | None:
        try:
            rec = json.loads(self._record_path(path).read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(rec, dict) and rec.get("path") == str(Path(path).absolute())
                and isinstance(rec.get("digest"), str) and isinstance(rec.get("at"), int | float)
                and isinstance(rec.get("files"), list)):
            return None
        return rec

    def _write(self, path: Path, digest: str, at: float, files: list[Identity]) -> None:
        """Write a record; a cache it cannot write to (full, read-only) only costs the next use a hash."""
        rec = {"path": str(Path(path).absolute()), "digest": digest, "at": at, "files": files}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=TEMP_PREFIX)
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(rec, fh, separators=(",", ":"))
            os.replace(tmp, self._record_path(path))
        except OSError:
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def recorded(self, path: Path) -> str | None:
        """The remembered digest of ``path`` if its files are unchanged and it is not due a re-hash, else None."""
        if self.reverify_s <= 0:
            return None
        rec = self._read(path)
        if rec is None or self.now() - float(rec["at"]) >= self.reverify_s:
            return None
        try:
            return rec["digest"] if identities(path) == rec["files"] else None
        except FileNotFoundError:
            return None

    def digest(self, path: Path, compute: Callable[[Path], str], *, force: bool = False) -> str:
        """``path``'s digest: remembered (see module), else ``compute(path)``, remembered if nothing changed meanwhile.
        ``force``: compute it whatever is remembered (a scrub). FileNotFoundError when the entry is gone."""
        known = None if force else self.recorded(path)
        if known is not None:
            return known
        at, started_ns = self.now(), time.time_ns()
        before = identities(path)
        got = compute(path)
        if self.reverify_s > 0 and identities(path) == before and not racy(before, started_ns):
            self._write(path, got, at, before)
        return got

    def touched(self, path: Path) -> None:
        """Re-record ``path``'s identities after its owner changed its times (digest and time kept); no record: no-op."""
        rec = self._read(path)
        if rec is None:
            return
        try:
            self._write(path, rec["digest"], float(rec["at"]), identities(path))
        except FileNotFoundError:
            self.forget(path)

    def forget(self, path: Path) -> None:
        self._record_path(path).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Remove records whose entry is gone; returns how many."""
        if not self.dir.is_dir():
            return 0
        removed = 0
        for rec_path in self.dir.iterdir():
            if rec_path.name.startswith(TEMP_PREFIX):
                continue
            try:
                named = json.loads(rec_path.read_text()).get("path")
            except (OSError, ValueError, AttributeError):
                named = None
            if not isinstance(named, str) or not os.path.exists(named):
                rec_path.unlink(missing_ok=True)
                removed += 1
        return removed
