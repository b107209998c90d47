"""In-memory workflow services (:mod:`gpufleet.store.workflow`): Step Functions task tokens, AWS Batch jobs and the
EventBridge bus, each recording what it was sent.

- :class:`MemoryTaskTokens` (``TaskTokens`` / ``RunTokens``): the tokens a workflow waits on (:meth:`wait`).
  ``fail`` / ``succeed`` end the wait, ``heartbeat`` keeps it; a token no task waits on (never issued, already
  answered, or :meth:`time_out`) answers ``False``, as the adapter maps Step Functions' ``InvalidToken`` /
  ``TaskDoesNotExist`` / ``TaskTimedOut``. ``sent`` lists what the workflow accepted, serialised as the adapter
  serialises it (``cause`` and ``output`` are JSON, the cause cut at 32,768 characters).
- :class:`MemoryBatchJobs` (``BatchJobs``): jobs by queue and name (:meth:`submit`); ``terminate_named``
  terminates the unfinished ones (not SUCCEEDED or FAILED), which then read FAILED with the reason.
- :class:`MemoryEventBus` (``EventBus``): ``sent`` lists (detail type, detail) as a subscriber receives them
  (the detail through JSON); a bus that does not take events (``refusing``) raises TransientError and keeps
  nothing.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from gpufleet.errors import TransientError

FINISHED_BATCH = ("SUCCEEDED", "FAILED")


@dataclass(frozen=True)
class TaskSend:
    """One answer the workflow accepted: ``kind`` is ``fail``, ``heartbeat`` or ``succeed``."""

    kind: str
    token: str
    error: str | None = None
    cause: str | None = None
    output: str | None = None


@dataclass
class MemoryTaskTokens:
    sent: list[TaskSend] = field(default_factory=list)
    _waiting: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, token: str | None = None) -> str:
        """A task starts waiting on ``token`` (a new one when None); returns it."""
        token = token or uuid.uuid4().hex
        with self._lock:
            self._waiting.add(token)
        return token

    def time_out(self, token: str) -> None:
        """The task waiting on ``token`` timed out: nothing waits on it any more."""
        with self._lock:
            self._waiting.discard(token)

    def _answer(self, send: TaskSend, *, ends: bool) -> bool:
        with self._lock:
            if send.token not in self._waiting:
                return False
            if ends:
                self._waiting.discard(send.token)
            self.sent.append(send)
            return True

    def fail(self, token: str, error: str, cause: dict[str, Any]) -> bool:
        return self._answer(TaskSend("fail", token, error=error, cause=json.dumps(cause)[:32768]), ends=True)

    def heartbeat(self, token: str) -> bool:
        return self._answer(TaskSend("heartbeat", token), ends=False)

    def succeed(self, token: str, output: dict[str, Any]) -> bool:
        return self._answer(TaskSend("succeed", token, output=json.dumps(output, sort_keys=True)), ends=True)


@dataclass
class BatchJob:
    job_id: str
    queue: str
    name: str
    status: str = "RUNNABLE"
    reason: str | None = None


@dataclass
class MemoryBatchJobs:
    jobs: dict[str, BatchJob] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, queue: str, name: str, status: str = "RUNNABLE") -> str:
        """A job ``name`` in ``queue`` with ``status``; returns its id."""
        job = BatchJob(uuid.uuid4().hex, queue, name, status)
        with self._lock:
            self.jobs[job.job_id] = job
        return job.job_id

    def terminate_named(self, queue: str, name: str, reason: str) -> list[str]:
        done = []
        with self._lock:
            for job in self.jobs.values():
                if job.queue == queue and job.name == name and job.status not in FINISHED_BATCH:
                    job.status, job.reason = "FAILED", reason
                    done.append(job.job_id)
        return done


@dataclass
class MemoryEventBus:
    bus_name: str = "gpufleet"
    source: str = "gpufleet"
    #: a bus that takes no events (deleted, unreachable): every put raises TransientError
    refusing: bool = False
    sent: list[tuple[str, Any]] = field(default_factory=list)

    def put(self, detail_type: str, detail: dict[str, Any]) -> None:
        body = json.dumps(detail)
        if self.refusing:
            raise TransientError(f"not sent: event bus {self.bus_name} does not take events")
        self.sent.append((detail_type, json.loads(body)))
