"""Checkpoint uploads in a separate writer process, so the compute process's GIL and cores stay free.

Contract:
- :class:`ProcessCheckpointer` has the interface of
  :class:`gpufleet.runtime.checkpoint.AsyncCheckpointer` (``submit``, ``flush``,
  ``raise_error``, ``close``, ``written``, ``last``, ``error``). ``submit``
  serialises the snapshot on the caller's thread (the serializer must be cheap:
  :func:`gpufleet.runtime.denoise.serialize` takes tens of microseconds) and
  hands the bytes to a sender thread that writes them to the child's stdin (a
  blocking pipe write that holds no GIL). The child
  (``python -m gpufleet.runtime.ckptproc``, started with ``nice`` added to its
  niceness) builds its own :class:`CheckpointStore` from a
  :class:`CheckpointTarget` and clients from the environment, and runs
  :meth:`CheckpointStore.save` for each snapshot: the same atomic PUT, content
  hash and epoch-fenced pointer as the thread writer.
- Coalescing: at most one upload is in flight in the child and one snapshot
  waits in the parent; a newer one replaces the waiting one (counted in
  ``coalesced``). With a :class:`gpufleet.runtime.ckptpace.UploadPacer`, the
  waiting snapshot is sent only when the pacer allows (``tick()`` after every
  step feeds it); ``flush`` and ``close`` send it regardless.
  ``written + coalesced + skipped == submitted`` once flushed. Uploads happen
  in step order, so the newest written checkpoint is the recovery point.
- Errors: the first failure in the child (e.g. :class:`gpufleet.errors.StaleEpoch`)
  comes back by type name and detail, is kept in ``error`` and re-raised by
  ``raise_error``; later snapshots are acknowledged as skipped and not written.
  A child that dies is an error too; ``flush`` never hangs on a dead child.
- The child's stdout carries only the protocol (JSON lines, one per snapshot);
  anything else it prints goes to stderr. It ignores the stop signals and SIGINT (a stop
  signal to the process group is the runtime's to handle) and exits when its
  stdin closes (``close``, or the parent dying).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpufleet import errors
from gpufleet.envelope import STOP_SIGNALS
from gpufleet.runtime.checkpoint import CheckpointRef, CheckpointStore
from gpufleet.runtime.ckptpace import UploadPacer, blocked_wait_s

log = logging.getLogger("gpufleet.runtime.ckptproc")

_FRAME = struct.Struct("<QqQ")  # seq, step, payload length


@dataclass(frozen=True)
class CheckpointTarget:
    """Where a job's checkpoints go; picklable/JSON-able, so another process can rebuild the store."""

    bucket: str
    prefix: str
    epoch: int
    jobs_table: str
    job_id: str
    #: the on-prem node whose tag the uploads carry ("" untagged: Batch)
    node_id: str = ""
    #: the node API of an on-prem node ("" on Batch): the pointer and the object credentials come through it
    node_api_url: str = ""

    def build(self, warm: bool = False) -> CheckpointStore:
        """A store with S3 and DynamoDB clients built from the environment (``AWS_ENDPOINT_URL`` honoured); on an
        on-prem node (``node_api_url``) the pointer goes through the node API and the objects use the
        attempt's scoped credentials.

        ``warm``: make one read through each client first (a one-page listing of the checkpoint prefix,
        GetItem of the job; both within the runtime's permissions, on-prem too), so botocore's lazy set-up (endpoint rules, operation
        models, connections; about 15 ms of CPU) is paid before the loop rather than during the first
        upload. A failed warm-up is logged and ignored: the first upload reports real errors."""
        from gpufleet.clock import SystemClock
        from gpufleet.store.clients import default_region
        from gpufleet.store.nodeapi import worker_adapters

        job, objects = worker_adapters(table=self.jobs_table, job_id=self.job_id, epoch=self.epoch,
                                       node_api_url=self.node_api_url or None, node_id=self.node_id,
                                       region=default_region(), clock=SystemClock())
        store = CheckpointStore(objects, self.bucket, self.prefix, self.epoch,
                                lambda ref: job.set_checkpoint(ref.key, ref.sha256, ref.step))
        if warm:
            try:
                next(iter(store.objects.list_keys(self.bucket, f"{self.prefix}checkpoints/")), None)
                job.get()
            except Exception as err:  # noqa: BLE001 - best effort; save() surfaces real failures
                log.warning("checkpoint writer warm-up failed: %s", err)
        return store


def _rebuild_error(kind: str, detail: str) -> BaseException:
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.GpufleetError):
        return cls(detail)
    return RuntimeError(f"checkpoint writer: {kind}: {detail}")


class ProcessCheckpointer:
    """Background writer in a child process: ``submit`` returns once the bytes are handed over."""

    def __init__(self, target: CheckpointTarget, serialize: Callable[[Any], bytes], nice: int = 10,
                 env: dict[str, str] | None = None, pacer: UploadPacer | None = None) -> None:
        self.serialize = serialize
        self.pacer = pacer
        self._inflight = False  # a frame was sent and its acknowledgement has not come back
        self._draining = 0
        self.error: BaseException | None = None
        self.last: CheckpointRef | None = None
        self.written = 0
        self.coalesced = 0
        self.skipped = 0
        self.submitted = 0
        self._done = 0
        self._pending: tuple[int, int, bytes] | None = None
        self._closed = False
        self._dead = False
        self._cv = threading.Condition()
        self.ready = threading.Event()  # set once the child has built its store (or died)
        cfg = json.dumps({"target": asdict(target), "nice": nice})
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet.runtime.ckptproc", cfg],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self._sender = threading.Thread(target=self._send_loop, name="checkpoint-sender", daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name="checkpoint-acks", daemon=True)
        self._sender.start()
        self._receiver.start()

    def submit(self, step: int, snap: Any) -> None:
        data = self.serialize(snap)
        with self._cv:
            if self._closed:
                raise RuntimeError("checkpointer is closed")
            self.submitted += 1
            if self._dead:
                self._done += 1
                self.skipped += 1
                return
            if self._pending is not None:  # never reached the child: the newer snapshot supersedes it
                self.coalesced += 1
                self._done += 1
            self._pending = (self.submitted, step, data)
            if self._may_send():  # only when the sender would act: a woken thread takes the GIL from the loop
                self._cv.notify_all()

    def tick(self) -> None:
        """The loop finished a step (feeds the pacer; cheap)."""
        if self.pacer is not None:
            with self._cv:
                self.pacer.tick()
                if self._may_send():
                    self._cv.notify_all()

    def accepts(self) -> bool:
        """Whether a snapshot submitted now would be sent at once (nothing waiting or in flight, the
        pacer allows, the child alive)."""
        with self._cv:
            return self._pending is None and not self._dead and not self._inflight and (
                self.pacer is None or self.pacer.may_start())

    def _may_send(self) -> bool:
        if self._pending is None or self._inflight:
            return False
        return self._draining > 0 or self._closed or self.pacer is None or self.pacer.may_start()

    def _send_loop(self) -> None:
        out = self.proc.stdin
        try:
            while True:
                with self._cv:
                    while not self._may_send() and not (self._closed and self._pending is None):
                        self._cv.wait(blocked_wait_s(self.pacer) if self._pending is not None else None)
                    if self._pending is None:
                        return
                    seq, step, data = self._pending
                    self._pending = None
                    self._inflight = True
                    if self.pacer is not None:
                        self.pacer.started()
                view = memoryview(_FRAME.pack(seq, step, len(data)) + data)
                while view:
                    view = view[out.write(view):]
        except (BrokenPipeError, ValueError, OSError) as err:  # the child is gone; the receiver reports it
            log.debug("checkpoint sender stopped: %s", err)
        finally:
            try:
                out.close()
            except OSError:
                pass

    def _recv_loop(self) -> None:
        # Buffered: a raw pipe's readline reads one byte per system call (and per GIL round trip).
        for line in io.BufferedReader(self.proc.stdout):
            msg = json.loads(line)
            with self._cv:
                status = msg["status"]
                if status == "written":
                    self.written += 1
                    self.last = CheckpointRef(msg["key"], msg["sha256"], int(msg["step"]))
                elif status == "coalesced":
                    self.coalesced += 1
                elif status == "skipped":
                    self.skipped += 1
                elif status == "failed" and self.error is None:
                    self.error = _rebuild_error(msg["error_type"], msg["detail"])
                    self.skipped += 1
                if status == "ready":
                    self.ready.set()
                else:
                    self._done += 1
                    if self._inflight:
                        self._inflight = False
                        if self.pacer is not None:
                            self.pacer.finished()
                self._cv.notify_all()
        rc = self.proc.wait()
        with self._cv:
            self._dead = True
            lost = self.submitted - self._done  # sent but unacknowledged, or still waiting to be sent
            if self.error is None and (lost or rc != 0 or not self._closed):
                self.error = RuntimeError(f"checkpoint writer process exited with status {rc}")
            self._pending = None
            self._inflight = False
            self.skipped += lost
            self._done = self.submitted
            self._cv.notify_all()
        self.ready.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Send what is pending now (pacing aside) and wait until every submitted snapshot is written,
        coalesced or skipped; True if drained."""
        with self._cv:
            self._draining += 1
            self._cv.notify_all()
            try:
                return self._cv.wait_for(lambda: self._done >= self.submitted, timeout)
            finally:
                self._draining -= 1

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 30.0) -> None:
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._sender.join(timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._receiver.join(timeout)


class _Inbox:
    """Child side: the newest snapshot not yet started."""

    def __init__(self, emit: Callable[[dict], None]) -> None:
        self.emit = emit
        self.cv = threading.Condition()
        self.item: tuple[int, int, bytes] | None = None
        self.eof = False

    def put(self, item: tuple[int, int, bytes]) -> None:
        with self.cv:
            if self.item is not None:
                self.emit({"seq": self.item[0], "status": "coalesced"})
            self.item = item
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.eof = True
            self.cv.notify_all()

    def take(self) -> tuple[int, int, bytes] | None:
        with self.cv:
            self.cv.wait_for(lambda: self.item is not None or self.eof)
            item, self.item = self.item, None
            return item


def _read_frames(src, inbox: _Inbox) -> None:
    try:
        while True:
            head = src.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return
            seq, step, n = _FRAME.unpack(head)
            data = src.read(n)
            if len(data) < n:
                return
            inbox.put((seq, step, data))
    finally:
        inbox.close()


def main(argv: list[str] | None = None) -> int:
    cfg = json.loads((argv or sys.argv[1:])[0])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    lock = threading.Lock()

    def emit(msg: dict) -> None:
        with lock:
            proto.write(json.dumps(msg) + "\n")

    # A stop signal sent to the whole process group (systemd, a terminal) is the runtime's to handle: it
    # checkpoints and closes our stdin. We finish the upload in hand and exit on EOF.
    for sig in (*STOP_SIGNALS.values(), signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if cfg.get("nice"):
        os.nice(int(cfg["nice"]))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = CheckpointTarget(**cfg["target"]).build(warm=True)
    inbox = _Inbox(emit)
    reader = threading.Thread(target=_read_frames, args=(sys.stdin.buffer, inbox), daemon=True)
    reader.start()
    emit({"status": "ready"})
    failed = False
    while (item := inbox.take()) is not None:
        seq, step, data = item
        if failed:
            emit({"seq": seq, "status": "skipped"})
            continue
        try:
            ref = store.save(step, data)
        except Exception as err:  # reported to the parent; it re-raises
            log.error("checkpoint at step %d failed: %s", step, err)
            failed = True
            emit({"seq": seq, "status": "failed", "error_type": type(err).__name__, "detail": str(err)})
            continue
        emit({"seq": seq, "status": "written", **ref.as_item()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
