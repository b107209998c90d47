"""Atomic, verified, optionally asynchronous checkpoints in S3 with a fenced pointer.

Contract:
- A checkpoint is one S3 object ``<prefix>checkpoints/<step:06d>-e<epoch:04d>.ckpt``
  (a whole-object PUT: atomic) with ``sha256`` and ``step`` in its metadata.
  Only after the PUT succeeds does the job's ``checkpoint`` pointer move
  (``{"key", "sha256", "step"}``, a write fenced by epoch). A stale worker's
  blob never overwrites another epoch's blob, and its pointer write raises
  :class:`gpufleet.errors.StaleEpoch`.
- :meth:`CheckpointStore.load` verifies the content hash (and that the payload
  parses). If the newest checkpoint is missing or corrupt it falls back to the
  previous valid one (older steps under the prefix, verified against their
  metadata hash), and returns ``None`` when nothing valid exists. It reads only
  keys the listing of the prefix returned: a GET of a missing key is a 403, not
  a 404, for a caller whose ListBucket grant is limited to a prefix (the on-prem
  agent role), so existence is decided by the listing.
- :class:`AsyncCheckpointer` moves serialisation and upload to a background
  thread so the compute loop keeps running. It holds at most one pending
  snapshot (a newer one replaces an older one that has not started).
  :meth:`AsyncCheckpointer.flush` waits for the in-flight write; the first
  error is kept in :attr:`AsyncCheckpointer.error` and re-raised by
  :meth:`AsyncCheckpointer.raise_error`. Its Python work (boto3 calls) shares the
  compute process's GIL; :class:`gpufleet.runtime.ckptproc.ProcessCheckpointer`
  has the same interface and contract with the uploads in a separate process.
- Both asynchronous writers take an optional
  :class:`gpufleet.runtime.ckptpace.UploadPacer`: the loop calls ``tick()``
  after every step, and an upload starts only when the pacer allows it (the
  snapshot waiting meanwhile is replaced by newer ones). ``flush`` and ``close``
  ignore the pacer: what is pending is uploaded at once. ``accepts()`` says
  whether a snapshot submitted now would start uploading at once; the loop asks
  it before taking one, so it copies and serialises state only when the writer
  can use it (on a GPU the copy is a device-to-host transfer and a sync).
- :class:`LoopCheckpoints` is the compute loop's side: after each step it feeds the writer's pacer,
  takes a due checkpoint only when the writer accepts it, and times every moment the loop waits on a
  checkpoint (taking the snapshot and handing it over, a whole upload with the synchronous writer,
  draining the writer at the end): ``stall_s`` is the ``checkpoint_stall`` phase (:mod:`gpufleet.phases`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import NotFound
from gpufleet.runtime.ckptpace import UploadPacer, blocked_wait_s
from gpufleet.store.objectstore import ObjectStore, sha256_hex

log = logging.getLogger("gpufleet.runtime.checkpoint")

_NAME = re.compile(r"checkpoints/(\d{6})-e(\d{4,})\.ckpt$")


@dataclass(frozen=True)
class CheckpointRef:
    key: str
    sha256: str
    step: int

    def as_item(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "step": self.step}


class CheckpointStore:
    def __init__(self, objects: ObjectStore, bucket: str, prefix: str, epoch: int,
                 set_pointer: Callable[[CheckpointRef], None]) -> None:
        self.objects = objects
        self.bucket = bucket
        self.prefix = prefix
        self.epoch = epoch
        self.set_pointer = set_pointer

    def key_for(self, step: int) -> str:
        return f"{self.prefix}checkpoints/{step:06d}-e{self.epoch:04d}.ckpt"

    def save(self, step: int, data: bytes) -> CheckpointRef:
        """Upload ``data`` then move the fenced pointer (raises StaleEpoch if fenced off)."""
        digest = sha256_hex(data)
        key = self.key_for(step)
        self.objects.put_bytes(self.bucket, key, data, metadata={"sha256": digest, "step": str(step)})
        ref = CheckpointRef(key, digest, step)
        self.set_pointer(ref)
        return ref

    def _candidates(self, pointer: dict[str, Any] | None) -> list[tuple[str, str | None, int]]:
        out: list[tuple[str, str | None, int]] = []
        limit = None
        listed = list(self.objects.list_keys(self.bucket, f"{self.prefix}checkpoints/"))
        if pointer:
            if any(key == pointer["key"] for key, _size in listed):
                out.append((pointer["key"], pointer["sha256"], int(pointer["step"])))
            else:
                log.warning("checkpoint %s is missing; falling back", pointer["key"])
            limit = int(pointer["step"])
        older = []
        for key, _size in listed:
            m = _NAME.search(key)
            if not m:
                continue
            step = int(m.group(1))
            if limit is not None and step > limit:
                continue  # never newer than the authoritative pointer
            if pointer and key == pointer["key"]:
                continue
            older.append((step, int(m.group(2)), key))
        for step, _epoch, key in sorted(older, reverse=True):
            out.append((key, None, step))
        return out

    def load(self, pointer: dict[str, Any] | None, validate: Callable[[bytes], Any]) -> tuple[CheckpointRef, Any] | None:
        """Newest valid checkpoint as (ref, validate(data)), or None.

        ``validate`` parses the payload and raises ``ValueError`` when it is unusable.
        Without a pointer there is no checkpoint (blobs alone are not authoritative).
        """
        if not pointer:
            return None
        for key, want, step in self._candidates(pointer):
            try:
                data = self.objects.get_bytes(self.bucket, key)
                if want is None:
                    want = self.objects.head(self.bucket, key).get("Metadata", {}).get("sha256")
            except NotFound:
                log.warning("checkpoint %s is missing; falling back", key)
                continue
            digest = sha256_hex(data)
            if digest != want:
                log.warning("checkpoint %s is corrupt (sha256 %s != %s); falling back", key, digest, want)
                continue
            try:
                parsed = validate(data)
            except ValueError as err:
                log.warning("checkpoint %s does not load (%s); falling back", key, err)
                continue
            return CheckpointRef(key, digest, step), parsed
        return None


class AsyncCheckpointer:
    """Background writer: ``submit`` returns at once; ``flush`` waits."""

    def __init__(self, store: CheckpointStore, serialize: Callable[[Any], bytes],
                 pacer: UploadPacer | None = None) -> None:
        self.store = store
        self.serialize = serialize
        self.pacer = pacer
        self._cv = threading.Condition()
        self._pending: tuple[int, Any] | None = None
        self._busy = False
        self._closed = False
        self._draining = 0
        self.error: BaseException | None = None
        self.last: CheckpointRef | None = None
        self.written = 0
        self.submitted = 0
        self.coalesced = 0
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def submit(self, step: int, snap: Any) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("checkpointer is closed")
            self.submitted += 1
            if self._pending is not None:
                self.coalesced += 1
            self._pending = (step, snap)
            self._wake_if_ready()

    def tick(self) -> None:
        """The loop finished a step (feeds the pacer; cheap)."""
        if self.pacer is not None:
            with self._cv:
                self.pacer.tick()
                self._wake_if_ready()

    def accepts(self) -> bool:
        """Whether a snapshot submitted now would start uploading at once (nothing pending or in flight,
        and the pacer allows)."""
        with self._cv:
            return self._pending is None and not self._busy and self._may_start()

    def _wake_if_ready(self) -> None:
        # Only when the writer would act: a woken thread takes the GIL from the compute loop.
        if self._pending is not None and not self._busy and self._may_start():
            self._cv.notify_all()

    def _may_start(self) -> bool:
        return self._draining > 0 or self._closed or self.pacer is None or self.pacer.may_start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._pending is not None and self._may_start()) and not (
                        self._closed and self._pending is None):
                    self._cv.wait(blocked_wait_s(self.pacer) if self._pending is not None else None)
                if self._pending is None and self._closed:
                    return
                step, snap = self._pending
                self._pending = None
                self._busy = True
                if self.pacer is not None:
                    self.pacer.started()
            try:
                if self.error is None:
                    self.last = self.store.save(step, self.serialize(snap))
                    self.written += 1
            except BaseException as err:  # surfaced to the compute loop through raise_error()
                log.error("checkpoint at step %d failed: %s", step, err)
                self.error = err
            finally:
                with self._cv:
                    self._busy = False
                    if self.pacer is not None:
                        self.pacer.finished()
                    self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Upload what is pending now (pacing aside) and wait until nothing is in flight; True if drained."""
        with self._cv:
            self._draining += 1
            self._cv.notify_all()
            try:
                return self._cv.wait_for(lambda: self._pending is None and not self._busy, timeout)
            finally:
                self._draining -= 1

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)


class SyncCheckpointer:
    """Same interface as :class:`AsyncCheckpointer`, writing on the caller's thread (baseline)."""

    def __init__(self, store: CheckpointStore, serialize: Callable[[Any], bytes]) -> None:
        self.store = store
        self.serialize = serialize
        self.error: BaseException | None = None
        self.last: CheckpointRef | None = None
        self.written = 0

    def submit(self, step: int, snap: Any) -> None:
        self.last = self.store.save(step, self.serialize(snap))
        self.written += 1

    def tick(self) -> None:
        return None

    def accepts(self) -> bool:
        return True

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class CheckpointPolicy:
    """Checkpoint every ``every_steps`` steps or ``every_seconds`` seconds, whichever comes first (0 = off)."""

    every_steps: int = 0
    every_seconds: float = 0.0

    def due(self, steps_since: int, seconds_since: float) -> bool:
        if self.every_steps and steps_since >= self.every_steps:
            return True
        return bool(self.every_seconds) and seconds_since >= self.every_seconds


class LoopCheckpoints:
    """The compute loop's checkpointing (module contract): ``after_step`` once per step, ``drain`` at the end.

    ``writer``: any of the writers above; ``clock``: monotonic seconds (injectable for tests)."""

    def __init__(self, writer: Any, policy: CheckpointPolicy, start_step: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writer = writer
        self.policy = policy
        self.clock = clock
        self.stall_s = 0.0  # seconds the loop waited on checkpoints
        self.stalls = 0  # how many waits
        self.taken = 0
        self._last_step, self._last_t = start_step, clock()

    def tick(self) -> None:
        """A step just ended (feeds the writer's pacer)."""
        self.writer.tick()

    def maybe_take(self, step: int, total: int, snapshot: Callable[[], Any]) -> bool:
        """Take a checkpoint at ``step`` (of ``total``) if one is due and the writer accepts it now; True if
        taken. A due one the writer cannot take yet stays due: asked again after the next step."""
        if step >= total or not self.policy.due(step - self._last_step, self.clock() - self._last_t):
            return False
        if not self.writer.accepts():
            return False
        t0 = self.clock()
        try:
            self.writer.submit(step, snapshot())
        finally:
            self._stalled(t0)
        self._last_step, self._last_t = step, self.clock()
        self.taken += 1
        return True

    def drain(self) -> None:
        """Wait for what is pending or in flight (the loop is done); that wait is a stall too."""
        t0 = self.clock()
        try:
            self.writer.flush()
        finally:
            self._stalled(t0)

    def _stalled(self, t0: float) -> None:
        self.stall_s += max(0.0, self.clock() - t0)
        self.stalls += 1
