"""LoopCheckpoints: when the compute loop takes a due checkpoint and how long it waits on checkpoints
(``checkpoint_stall``), on a fake clock with real writers (no torch, no process)."""

from __future__ import annotations

from gpufleet.runtime.checkpoint import (
    AsyncCheckpointer,
    CheckpointPolicy,
    CheckpointStore,
    LoopCheckpoints,
    SyncCheckpointer,
)
from gpufleet.runtime.ckptpace import UploadPacer


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Objects:
    """The one call a checkpoint save makes (a PUT), taking ``put_s`` seconds of ``clock``."""

    def __init__(self, clock: Clock | None = None, put_s: float = 0.0) -> None:
        self.clock, self.put_s, self.keys = clock, put_s, []

    def put_bytes(self, bucket, key, data, metadata=None):
        if self.clock is not None:
            self.clock.t += self.put_s
        self.keys.append(key)


def _store(objects) -> CheckpointStore:
    return CheckpointStore(objects, "ck", "jobs/j/", 1, lambda ref: None)


def test_a_synchronous_upload_is_a_stall_of_its_whole_length():
    clock = Clock()
    writer = SyncCheckpointer(_store(Objects(clock, 3.0)), lambda snap: b"x" * 8)
    loop = LoopCheckpoints(writer, CheckpointPolicy(every_steps=2), clock=clock)
    taken = []
    for step in range(1, 7):
        clock.t += 1.0  # the step
        loop.tick()
        if loop.maybe_take(step, 6, lambda s=step: {"step": s}):
            taken.append(step)
    loop.drain()
    assert taken == [2, 4]  # step 6 is the end: the output, not a checkpoint, is what counts then
    assert writer.written == 2 and loop.stalls == 3
    assert loop.stall_s == 6.0  # two 3 s uploads; the synchronous drain waits on nothing


def test_taking_the_snapshot_is_a_stall_and_a_refused_due_checkpoint_stays_due():
    clock = Clock()

    class Busy:
        """A writer that cannot take a snapshot while ``busy``, and whose drain takes 1.5 s."""

        busy, submitted = True, []

        def tick(self):
            pass

        def accepts(self):
            return not self.busy

        def submit(self, step, snap):
            self.submitted.append(step)

        def flush(self, timeout=None):
            clock.t += 1.5
            return True

    def snapshot():
        clock.t += 0.25  # the device-to-host copy
        return {}

    w = Busy()
    loop = LoopCheckpoints(w, CheckpointPolicy(every_seconds=2.0), clock=clock)
    for step in range(1, 5):
        clock.t += 1.0
        w.busy = step < 3
        loop.maybe_take(step, 10, snapshot)
    assert w.submitted == [3]  # due at step 2, refused, taken at the next step the writer accepted
    assert not loop.maybe_take(4, 10, snapshot)  # just taken: not due again yet
    loop.drain()
    assert loop.stall_s == 0.25 + 1.5 and loop.stalls == 2 and loop.taken == 1


def test_an_asynchronous_upload_under_the_pacer_costs_the_loop_only_its_drain():
    clock = Clock()
    objects = Objects()
    writer = AsyncCheckpointer(_store(objects), lambda snap: b"y", pacer=UploadPacer(0.0, 60.0, clock=clock))
    try:
        loop = LoopCheckpoints(writer, CheckpointPolicy(every_steps=1), clock=clock)
        for step in range(1, 4):
            clock.t += 1.0
            loop.tick()
            loop.maybe_take(step, 4, lambda: {})
            writer.flush()  # let the background upload finish before the next step (test only)
        stalled = loop.stall_s
        loop.drain()
    finally:
        writer.close()
    assert writer.written == loop.taken == 3
    assert stalled == 0.0 and loop.stall_s == 0.0  # the fake clock does not move while the thread uploads
