"""Stream the runtime's log lines to S3 in chunks (docs/contracts.md, "Logs").

Contract: :class:`S3LogHandler` is a ``logging.Handler`` that buffers records
as JSON lines ``{"ts", "level", "msg", "job_id", "epoch"}`` (plus ``trace_id``, the job's trace:
:mod:`gpufleet.tracing`, when it has one) and writes a chunk
object ``jobs/<job_id>/attempt-<epoch:04d>/<seq:08d>.log`` to the logs bucket
when ``max_lines`` are buffered, every ``interval_s`` seconds (background
flusher), and on ``close``. ``seq`` starts at 0 and increases by one per chunk,
so a reader lists the prefix in key order. An upload failure keeps the lines
for the next flush (and never raises into the logging call).

A gang member (``rank`` of ``world_size``) shares its attempt's prefix with the other members: its lines
carry ``"rank"`` and its chunks are numbered ``n * world_size + rank`` (its n-th chunk), so members never
overwrite each other's chunks and a listing interleaves them in chunk order.
"""

from __future__ import annotations

import json
import logging
import threading

from gpufleet.clock import Clock, iso
from gpufleet.errors import GpufleetError
from gpufleet.store.objects import chunk_key as log_chunk_key
from gpufleet.store.objectstore import ObjectStore


class S3LogHandler(logging.Handler):
    def __init__(self, objects: ObjectStore, bucket: str, job_id: str, epoch: int, *,
                 max_lines: int = 200, interval_s: float = 5.0, clock: Clock, trace_id: str | None = None,
                 rank: int | None = None, world_size: int = 1) -> None:
        super().__init__()
        self.rank = rank
        self.world_size = world_size if rank is not None else 1
        self.trace_id = trace_id
        self.objects = objects
        self.bucket = bucket
        self.job_id = job_id
        self.epoch = epoch
        self.max_lines = max_lines
        self.clock = clock
        self.seq = 0
        self._buf: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if interval_s > 0:
            self._thread = threading.Thread(target=self._tick, args=(interval_s,), name="log-flusher", daemon=True)
            self._thread.start()

    def _tick(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.flush()

    def emit(self, record: logging.LogRecord) -> None:
        fields = {"ts": iso(record.created), "level": record.levelname, "msg": record.getMessage(),
                  "job_id": self.job_id, "epoch": self.epoch}
        if self.trace_id:
            fields["trace_id"] = self.trace_id
        if self.rank is not None:
            fields["rank"] = self.rank
        line = json.dumps(fields)
        with self._lock:
            self._buf.append(line)
            full = len(self._buf) >= self.max_lines
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._buf:
                return
            lines, self._buf = self._buf, []
            seq = self.seq * self.world_size + (self.rank or 0)
            try:
                self.objects.put_bytes(self.bucket, log_chunk_key(self.job_id, self.epoch, seq),
                                       ("\n".join(lines) + "\n").encode(), content_type="application/x-ndjson")
                self.seq += 1
            except (GpufleetError, OSError):
                self._buf = lines + self._buf  # retried on the next flush

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
        super().close()
