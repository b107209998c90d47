"""Prefetch: while a held job waits for its GPUs, fetch its inputs and model into the node cache.

Contract:
- :class:`Prefetcher` runs one background thread that fills the cache for one held job at a time, in the
  order :meth:`Prefetcher.offer` was called (each job once). :meth:`Prefetcher.forget` takes a job off the
  queue; with ``stop=True`` (its message was released, its task is gone or its epoch fenced) a fetch in
  flight is told to stop too, and stops before its next object or model file. A job that starts while its
  fetch is in flight is forgotten without ``stop``: the fetch goes on, and the runtime waits for it on the
  cache's per-object and per-model locks, then hits (:mod:`gpufleet.runtime.staging`,
  :mod:`gpufleet.models.loader`). :meth:`Prefetcher.close` stops everything.
- Best effort: whatever the fetch raises is logged (``prefetch failed``) and counted, never raised; the job
  runs as it would have, staging what is missing itself.
- :func:`cache_filler` is the fetch: object credentials are the attempt's own, vended by the node API for
  an attempt placed on this node at its current epoch (the server checks; the agent holds no other S3
  access), the inputs go through :meth:`gpufleet.runtime.staging.Stager.prefetch` and a published model
  through :meth:`gpufleet.models.loader.ModelLoader.prefetch` (a ``generate`` job only), so the cache holds
  exactly what the runtime will look for. It returns a :class:`Prefilled` (what moved), logged by the
  prefetcher as ``prefetched`` with the job, epoch, model, bytes and seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.envelope import Envelope
from gpufleet.models.loader import ModelLoader, Stopped
from gpufleet.runtime.staging import Stager
from gpufleet.runtime.verified import REVERIFY_S
from gpufleet.store.nodeapi import NodeApiClient, scoped_s3_client
from gpufleet.store.objectstore import ObjectStore

log = logging.getLogger("onprem_agent.prefetch")

Key = tuple[str, int]


@dataclass(frozen=True)
class Prefilled:
    """What a prefetch put in the cache: input bytes moved and already there, the model and its bytes moved."""

    inputs: int = 0
    input_bytes_moved: int = 0
    input_bytes_cached: int = 0
    model: str | None = None
    model_bytes_moved: int = 0
    stopped: bool = False

    def as_log(self) -> dict:
        return {
            "inputs": self.inputs,
            "input_bytes_moved": self.input_bytes_moved,
            "input_bytes_cached": self.input_bytes_cached,
            "model": self.model,
            "model_bytes_moved": self.model_bytes_moved,
        }


Fill = Callable[[Envelope, Callable[[], bool]], Prefilled]


class Prefetcher:
    def __init__(self, fill: Fill, *, outcome: Callable[[str], None] = lambda _o: None) -> None:
        self._fill = fill
        self._outcome = outcome
        self._cv = threading.Condition()
        self._queue: dict[Key, Envelope] = {}
        self._offered: set[Key] = set()
        self._current: tuple[Key, threading.Event] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def offer(self, env: Envelope) -> None:
        """Queue ``env``'s job for a prefetch (once per job and epoch)."""
        key = (env.job_id, env.epoch)
        with self._cv:
            if self._closed or key in self._offered:
                return
            self._offered.add(key)
            self._queue[key] = env
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def forget(self, key: Key, stop: bool = False) -> None:
        """The job is no longer held: off the queue; with ``stop``, a fetch in flight stops too."""
        with self._cv:
            self._queue.pop(key, None)
            self._offered.discard(key)
            if stop and self._current is not None and self._current[0] == key:
                self._current[1].set()

    def busy(self) -> bool:
        with self._cv:
            return self._current is not None or bool(self._queue)

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._queue.clear()
            if self._current is not None:
                self._current[1].set()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                key, env = next(iter(self._queue.items()))
                del self._queue[key]
                stop = threading.Event()
                self._current = (key, stop)
            self._one(key, env, stop)
            with self._cv:
                self._current = None

    def _one(self, key: Key, env: Envelope, stop: threading.Event) -> None:
        extra = {"job_id": key[0], "epoch": key[1]}
        t0 = time.monotonic()
        try:
            got = self._fill(env, stop.is_set)
        except Stopped:
            got = Prefilled(stopped=True)
        except Exception as err:  # noqa: BLE001 - best effort: a failed prefetch never touches the job
            log.warning(
                "prefetch failed; the job stages what it needs itself",
                extra={**extra, "detail": f"{type(err).__name__}: {err}"[:500]},
            )
            self._outcome("failed")
            return
        seconds = round(time.monotonic() - t0, 3)
        if got.stopped or stop.is_set():
            log.info("prefetch stopped: the job is no longer held here", extra={**extra, "seconds": seconds})
            self._outcome("stopped")
            return
        log.info("prefetched", extra={**extra, **got.as_log(), "seconds": seconds})
        self._outcome("done")


def attempt_objects(
    api: NodeApiClient, *, region: str, endpoint_url: str | None, node_id: str
) -> Callable[[str, int], ObjectStore]:
    """Object stores with one attempt's credentials, vended by the node API (which checks the attempt is
    this node's, at the current epoch): the only S3 access the agent ever has."""

    def objects(job_id: str, epoch: int) -> ObjectStore:
        return ObjectStore(
            scoped_s3_client(api, job_id, epoch, region=region, endpoint_url=endpoint_url), node_id=node_id
        )

    return objects


def cache_filler(
    *, cache_dir: Path, objects: Callable[[str, int], ObjectStore], model_root: str | None, model_s3_root: str | None,
    reverify_s: float = REVERIFY_S,
) -> Fill:
    """The fetch of one held job (see module); ``objects(job_id, epoch)`` is the attempt's object store
    (:func:`attempt_objects`)."""

    def fill(env: Envelope, stop: Callable[[], bool]) -> Prefilled:
        spec = env.spec
        if spec is None:
            return Prefilled()
        inputs = list(spec.data.inputs)
        model = getattr(spec.workload, "model", None) if env.stage == "generate" and model_s3_root else None
        if not inputs and not model:
            return Prefilled()
        store = objects(env.job_id, env.epoch)
        staged = Stager(store, cache_dir, reverify_s=reverify_s).prefetch(inputs, stop) if inputs else None
        if stop():
            return Prefilled(stopped=True)
        resolved = ModelLoader(cache_dir, store, model_root, model_s3_root, reverify_s=reverify_s).prefetch(
            model, stop, expect=env.model_hash) if model else None
        return Prefilled(
            inputs=len(staged.inputs) if staged else 0,
            input_bytes_moved=staged.bytes_moved if staged else 0,
            input_bytes_cached=staged.bytes_cached if staged else 0,
            model=model if resolved is not None else None,
            model_bytes_moved=resolved.bytes_downloaded if resolved is not None else 0,
        )

    return fill
