"""One denoising batch shared by several jobs' generate stages running as threads of one warm worker.

Contract (docs/runtime.md, "Batches"):
- A :class:`DenoiseBatch` is created for ``expected`` members (the jobs the agent handed over together);
  each member's stage gets a :class:`BatchMember` (``StageContext.batch``) and otherwise runs exactly as
  alone: its own envelope, fenced writes, reporter, checkpoints, control, output and phases.
- :meth:`BatchMember.start` / :meth:`BatchMember.restore` build the member's loop state and
  :meth:`BatchMember.decode` its frames, one member at a time (they use the pipeline's scheduler, the global
  RNG and the VAE's decoding cache, which concurrent decodes would corrupt) with a private scheduler
  (:func:`gpufleet.runtime.denoise.own_scheduler`); the member then joins the batch. It is admitted at
  once while the batch holds fewer than its capacity (:func:`gpufleet.batching.capacity`: the configured
  maximum and the memory bound, computed on the first join from the member's request and the free
  memory), else it waits for a member to leave.
- :meth:`BatchMember.step` is the member's ``denoise_step``: it returns when the member's next step is
  done. A *round* runs when every admitted member has asked for its step (before the first round, also
  the expected members that have not joined or left yet, for at most ``gather_s``): the last to ask runs
  one :func:`gpufleet.runtime.denoise.denoise_batch_step` over all of them (each at its own step index)
  and the round's time goes to the :class:`gpufleet.batching.ShareLedger`. An error in a round is raised
  in every member of that round.
- :meth:`BatchMember.leave` (idempotent; the stage calls it whatever way its loop ends: done, cancelled,
  fenced, preempted, failed) removes the member: the remaining members' rounds go on without it at the
  next step boundary, their results unchanged (each member's rows are computed independently).
- Billing: the batch's GPU time is split among the members present (:meth:`BatchMember.arrive` when the
  member's job starts on the worker, :meth:`BatchMember.depart` when it ends): every interval between two
  such events adds ``interval / members present`` to each of them (``presence``, a
  :class:`gpufleet.batching.ShareLedger`), so the members' GPU-seconds add up to the batch's wall time and a
  member pays an equal part of the steps it took part in. ``ledger`` holds the rounds alone (the
  ``batch_gpu_s`` phase: a member's share of the batched steps).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufleet import batching
from gpufleet.runtime import denoise


class DenoiseBatch:
    def __init__(
        self,
        expected: int,
        *,
        max_members: int,
        free_bytes: Callable[[], int | None],
        gather_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_members = max_members
        self.free_bytes = free_bytes
        self.gather_s = gather_s
        self.clock = clock
        self.ledger = batching.ShareLedger()  # the rounds, split among their members
        self.presence = batching.ShareLedger()  # the batch's whole time, split among the members present
        self._present: set[int] = set()
        self._since = clock()
        self.capacity: int | None = None
        self.rounds = 0
        self._cv = threading.Condition()
        self._setup = threading.Lock()
        self._ids = itertools.count()
        self._unjoined = expected  # expected members that have neither joined nor left
        self._admitted: list[BatchMember] = []
        self._waiting: list[BatchMember] = []  # joined, over capacity
        self._asked: dict[BatchMember, tuple[Any, Any]] = {}
        self._done_round: dict[BatchMember, int] = {}
        self._errors: dict[BatchMember, BaseException] = {}
        self._running = False
        self._first_ask: float | None = None
        self._pipe = None  # the pipeline every member shares (the first joiner's)

    def member(self) -> BatchMember:
        return BatchMember(self, next(self._ids))

    # --- presence (billing) ------------------------------------------------------------------
    def _account(self) -> None:
        """Split the time since the last change among the members present then (under the lock)."""
        now = self.clock()
        if self._present:
            self.presence.record(now - self._since, sorted(self._present))
        self._since = now

    def _arrive(self, m: BatchMember) -> None:
        with self._cv:
            self._account()
            self._present.add(m.index)

    def _depart(self, m: BatchMember) -> float:
        with self._cv:
            self._account()
            self._present.discard(m.index)
            return self.presence.share_s(m.index)

    # --- membership --------------------------------------------------------------------------
    def _join(self, m: BatchMember, pipe, req) -> bool:
        """Admit ``m`` (waiting while the batch is full); False if it cannot share this batch's pipeline
        (another load of the model: it then runs alone)."""
        with self._cv:
            if self._pipe is None:
                self._pipe = pipe
            elif self._pipe is not pipe:
                self._unjoined -= 1
                self._cv.notify_all()
                return False
            if self.capacity is None:
                per = denoise.member_bytes_for(pipe, req)
                self.capacity = batching.capacity(self.max_members, self.free_bytes(), per)
            self._unjoined -= 1
            self._waiting.append(m)
            self._admit()
            self._cv.notify_all()
            while m not in self._admitted:
                self._cv.wait()
        return True

    def _admit(self) -> None:
        while self._waiting and len(self._admitted) < (self.capacity or 1):
            self._admitted.append(self._waiting.pop(0))

    def _leave(self, m: BatchMember, joined: bool) -> None:
        with self._cv:
            if not joined:
                self._unjoined -= 1
            if m in self._admitted:
                self._admitted.remove(m)
            if m in self._waiting:
                self._waiting.remove(m)
            self._asked.pop(m, None)
            self._admit()
            self._cv.notify_all()  # the members still asking run the round without it

    # --- rounds ------------------------------------------------------------------------------
    def _step(self, m: BatchMember, req, state) -> None:
        with self._cv:
            self._asked[m] = (req, state)
            if self._first_ask is None:
                self._first_ask = self.clock()
            self._cv.notify_all()
        while True:
            self._maybe_run()
            with self._cv:
                if m in self._errors:
                    raise self._errors.pop(m)
                if m not in self._asked:
                    return
                self._cv.wait(self._wait_s())

    def _wait_s(self) -> float | None:
        """How long to sleep for a change (under the lock): until the first round's gathering ends, else
        until notified (an ask, a leave or a round's end)."""
        if self.rounds == 0 and self._unjoined > 0 and self._first_ask is not None:
            return max(0.005, self.gather_s - (self.clock() - self._first_ask))
        return None

    def _ready(self) -> bool:
        """Whether a round can run now (under the lock)."""
        if self._running or not self._admitted:
            return False
        if any(m not in self._asked for m in self._admitted):
            return False
        if self.rounds == 0 and self._unjoined > 0 and len(self._admitted) < (self.capacity or 1):
            # gather the first round: wait (bounded) for the expected members still starting
            return self.clock() - (self._first_ask or self.clock()) >= self.gather_s
        return True

    def _maybe_run(self) -> None:
        with self._cv:
            if not self._ready():
                return
            members = list(self._admitted)
            work = [self._asked[m] for m in members]
            self._running = True
        t0 = self.clock()
        error: BaseException | None = None
        try:
            denoise.denoise_batch_step(self._pipe, work)
        except BaseException as err:  # noqa: BLE001 - handed to every member of the round
            error = err
        seconds = self.clock() - t0
        with self._cv:
            self.rounds += 1
            self.ledger.record(seconds, [m.index for m in members])
            for m in members:
                self._asked.pop(m, None)
                if error is not None:
                    self._errors[m] = error
            self._running = False
            self._cv.notify_all()


class BatchMember:
    """One job's handle on its :class:`DenoiseBatch` (module contract)."""

    def __init__(self, batch: DenoiseBatch, index: int) -> None:
        self.batch = batch
        self.index = index
        self.alone = False  # could not share the batch's pipeline: steps run alone
        self._joined = False
        self._left = False

    def start(self, pipe, req: denoise.GenerationRequest, fingerprint: str) -> denoise.DenoiseState:
        with self.batch._setup:
            state = denoise.own_scheduler(pipe, denoise.start(pipe, req, fingerprint))
        self._enter(pipe, req)
        return state

    def restore(self, pipe, req: denoise.GenerationRequest, snap: dict[str, Any]) -> denoise.DenoiseState:
        with self.batch._setup:
            state = denoise.own_scheduler(pipe, denoise.restore(pipe, snap))
        self._enter(pipe, req)
        return state

    def decode(self, pipe, latents):
        """:func:`gpufleet.runtime.denoise.decode`, one member at a time (the VAE keeps a decoding cache)."""
        with self.batch._setup:
            return denoise.decode(pipe, latents)

    def _enter(self, pipe, req) -> None:
        if self.batch._join(self, pipe, req):
            self._joined = True
        else:
            self.alone, self._left = True, True

    def step(self, pipe, req: denoise.GenerationRequest, state: denoise.DenoiseState) -> None:
        if self.alone:
            denoise.denoise_step(pipe, req, state)
        else:
            self.batch._step(self, req, state)

    def leave(self) -> None:
        if self._left:
            return
        self._left = True
        self.batch._leave(self, self._joined)

    def steps(self) -> int:
        return self.batch.ledger.steps(self.index)

    def widest(self) -> int:
        return self.batch.ledger.widest(self.index)

    def share_s(self) -> float:
        return self.batch.ledger.share_s(self.index)

    def arrive(self) -> None:
        """The member's job started on the worker: from now on it shares the batch's GPU time."""
        self.batch._arrive(self)

    def depart(self) -> float:
        """The member's job ended: its GPU-seconds, the batch's time split among the members present."""
        return self.batch._depart(self)
