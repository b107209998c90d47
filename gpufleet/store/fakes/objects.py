"""In-memory S3 objects for :class:`~gpufleet.store.objects.Checkpoints` and :class:`~gpufleet.store.objects.JobOutputs`.

A :class:`MemoryBucket` holds objects by key (body and tags). :class:`MemoryCheckpoints` tags a job's objects
(``jobs/<job_id>/``) with :data:`~gpufleet.store.objects.ENDED_TAG`, keeping their other tags and counting only
those it tagged now (idempotent), as :func:`~gpufleet.store.objects.mark_checkpoints_ended` does;
:class:`MemoryJobOutputs` lists ``(key, size)`` under a ``jobs/`` prefix in key order, at most ``limit`` + 1.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpufleet.store.objects import ENDED_TAG, log_prefix


@dataclass
class MemoryBucket:
    #: key -> (body, tags as S3 gives them: ``[{"Key": ..., "Value": ...}]``)
    objects: dict[str, tuple[bytes, list[dict[str, str]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, key: str, body: bytes, tags: dict[str, str] | None = None) -> None:
        with self.lock:
            self.objects[key] = (body, [{"Key": k, "Value": v} for k, v in (tags or {}).items()])

    def tags(self, key: str) -> dict[str, str]:
        with self.lock:
            return {t["Key"]: t["Value"] for t in self.objects[key][1]}

    def keys(self, prefix: str) -> list[str]:
        with self.lock:
            return sorted(k for k in self.objects if k.startswith(prefix))


@dataclass
class MemoryCheckpoints:
    bucket: MemoryBucket

    def mark_ended(self, job_id: str) -> int:
        key, value = ENDED_TAG
        tagged = 0
        with self.bucket.lock:
            for name in sorted(k for k in self.bucket.objects if k.startswith(log_prefix(job_id))):
                body, tags = self.bucket.objects[name]
                if {"Key": key, "Value": value} in tags:
                    continue
                self.bucket.objects[name] = (
                    body,
                    [t for t in tags if t["Key"] != key] + [{"Key": key, "Value": value}],
                )
                tagged += 1
        return tagged


@dataclass
class MemoryJobOutputs:
    bucket: MemoryBucket

    def list(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        if not prefix.startswith("jobs/"):
            raise ValueError(f"output prefix {prefix!r} is not under jobs/")
        with self.bucket.lock:
            found = sorted((k, len(body)) for k, (body, _) in self.bucket.objects.items() if k.startswith(prefix))
        return found[: limit + 1]
