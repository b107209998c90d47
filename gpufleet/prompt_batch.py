"""Prompt checks that arrive together are decided in one batch (one forward pass of the prompt encoder).

Why: the encoder's cost is mostly per forward pass, not per prompt (one prompt about 60-80 ms of CPU, twenty
prompts in one pass about 7.5 ms each). On AWS each CheckPrompt invocation has its container to itself and
this changes nothing; in the embedded stack every CheckPrompt runs in one process, one invocation at a time.

Contract of :class:`PromptBatcher` (``decide(prompts) -> decisions``, in order, e.g.
:meth:`gpufleet.safety.PromptFilter.check_many`):

- :meth:`PromptBatcher.check` returns the decision of one prompt, the same as ``decide([prompt])[0]``.
- Calls from several threads at once share batches: the first caller of a batch leads it; while it waits
  (see below), every other caller adds its prompt to that batch and waits for its decision; the leader then
  decides them all in one ``decide`` call (at most ``max_batch``; a later caller starts the next batch). An
  error of ``decide`` is raised in every caller of that batch.
- The leader waits only inside a *yield window*: :func:`yielding` sets, per process, a context manager under
  which the leader waits (the embedded stack's Lambda runner releases its lock there, so the queued
  CheckPrompt invocations can reach their check). It waits until no prompt has joined for ``quiet_s`` or
  ``max_wait_s`` has passed. Without a yield window set (AWS, tests) a caller decides its prompt at once.
- A window may come with ``queued`` (the number of invocations waiting to run: the embedded stack's Lambda runner
  counts those waiting for its lock): when it is 0 as the leader's window opens, nothing could join, and the leader
  decides at once instead of waiting ``quiet_s`` (an idle stack's lone job).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

#: the process's yield window (see the module docstring); None: no waiting
_YIELD: Callable[[], AbstractContextManager[Any]] | None = None
#: how many invocations wait to run, read as the leader's window opens; None: unknown (the leader waits)
_QUEUED: Callable[[], int] | None = None


@contextmanager
def yielding(window: Callable[[], AbstractContextManager[Any]],
             queued: Callable[[], int] | None = None) -> Iterator[None]:
    """Set the process's yield window (and what counts the invocations waiting to run) while the block runs
    (the embedded stack, while it runs)."""
    global _YIELD, _QUEUED
    saved = _YIELD, _QUEUED
    _YIELD, _QUEUED = window, queued
    try:
        yield
    finally:
        _YIELD, _QUEUED = saved


class _Batch:
    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.decisions: list[Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class PromptBatcher:
    def __init__(self, decide: Callable[[list[str]], list[Any]], *, quiet_s: float = 0.05,
                 max_wait_s: float = 0.5, max_batch: int = 64) -> None:
        self.decide = decide
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._open: _Batch | None = None
        #: batches decided and prompts in them
        self.batches = 0
        self.prompts = 0

    def check(self, prompt: str) -> Any:
        window, queued = _YIELD, _QUEUED
        if window is None:
            return self._run(_single(prompt))[0]
        with self._cond:
            batch = self._open
            if batch is not None and len(batch.prompts) < self.max_batch:
                index = len(batch.prompts)
                batch.prompts.append(prompt)
                self._cond.notify_all()
                leader = False
            else:
                batch = self._open = _Batch()
                batch.prompts.append(prompt)
                index, leader = 0, True
        with window():
            if leader:
                self._gather(batch, alone=queued is not None and queued() == 0)
            else:
                batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert batch.decisions is not None
        return batch.decisions[index]

    def _gather(self, batch: _Batch, alone: bool = False) -> None:
        deadline = time.monotonic() + self.max_wait_s
        with self._cond:
            seen, quiet_from = len(batch.prompts), time.monotonic()
            while not alone and len(batch.prompts) < self.max_batch:
                now = time.monotonic()
                if now >= deadline or now - quiet_from >= self.quiet_s:
                    break
                self._cond.wait(min(self.quiet_s, deadline - now))
                if len(batch.prompts) != seen:
                    seen, quiet_from = len(batch.prompts), time.monotonic()
            if self._open is batch:
                self._open = None  # later callers start the next batch
        try:
            self._run(batch)
        finally:
            batch.done.set()

    def _run(self, batch: _Batch) -> list[Any]:
        try:
            batch.decisions = list(self.decide(list(batch.prompts)))
        except BaseException as err:
            batch.error = err
            raise
        self.batches += 1
        self.prompts += len(batch.prompts)
        return batch.decisions


def _single(prompt: str) -> _Batch:
    batch = _Batch()
    batch.prompts.append(prompt)
    return batch
