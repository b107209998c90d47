"""Warm workers, the agent's side: which envelopes they serve, and how a job on one is signalled and ended
(a fake worker process: the replies it would write arrive on its queue)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from gpufleet.clock import FakeClock
from gpufleet.envelope import Envelope
from onprem_agent.warm import BatchRun, MemberChild, WarmChild, WarmWorker, serves


def _envelope(stage: str, kind: str = "video.generate") -> Envelope:
    workload = ({"kind": "video.generate", "prompt": "p"} if kind == "video.generate"
                else {"kind": "container", "image": "busybox", "command": ["true"]})
    doc = {"job_id": "j", "attempt": 1, "epoch": 1, "stage": stage, "spec": {"workload": workload},
           "s3": {"bucket_outputs": "b", "bucket_checkpoints": "b", "bucket_logs": "b", "output_prefix": "jobs/j/",
                  "checkpoint_prefix": "jobs/j/", "log_prefix": "jobs/j/attempt-0001/"}}
    return Envelope.model_validate(doc)


def test_only_the_platforms_generate_stage_runs_on_a_warm_worker():
    assert serves(_envelope("generate"))
    assert not serves(_envelope("container", kind="container"))  # tenant code: always a fresh process
    assert not serves(_envelope("finalize"))


@dataclass
class FakeProc:
    returncode: int | None = None

    def wait(self, timeout=None):
        return self.returncode


@dataclass
class FakeWorkerChild:
    clock: FakeClock
    pid: int = 77
    pgid: int = 77
    proc: FakeProc = field(default_factory=FakeProc)
    sent: list[int] = field(default_factory=list)
    dies_at_once: bool = True  # False: a SIGKILL lands later (a loaded machine), the process still looks alive

    def poll(self):
        return self.proc.returncode

    def signal(self, sig: int) -> None:
        self.sent.append(sig)
        if sig == signal.SIGKILL and self.dies_at_once:
            self.proc.returncode = -signal.SIGKILL

    def kill(self, timeout: float = 5.0) -> None:
        self.signal(signal.SIGKILL)

    def group_alive(self) -> bool:
        return self.proc.returncode is None


@dataclass
class FakePool:
    released: list = field(default_factory=list)
    discarded: list = field(default_factory=list)

    def release(self, w):
        self.released.append(w)

    def discard(self, w):
        self.discarded.append(w)


def _rig():
    clock = FakeClock()
    proc_child = FakeWorkerChild(clock)
    worker = WarmWorker(key=(0,), child=proc_child)  # type: ignore[arg-type]
    pool = FakePool()
    return WarmChild(pool, worker, clock.now()), worker, pool, proc_child  # type: ignore[arg-type]


def test_a_sigterm_before_the_worker_took_the_job_is_sent_once_it_has():
    job, worker, _pool, proc = _rig()
    job.signal(signal.SIGTERM)
    assert proc.sent == [] and job.poll() is None
    worker.replies.put({"event": "started"})
    assert job.poll() is None
    assert proc.sent == [signal.SIGTERM]


def test_a_cancel_before_the_worker_took_the_job_is_sent_once_it_has_and_the_first_stop_wins():
    job, worker, _pool, proc = _rig()
    job.signal(signal.SIGUSR1)  # the cancel's signal: the job's runtime stops as a cancel, not a preemption
    job.signal(signal.SIGTERM)  # a drain after it: the runtime keeps the first stop anyway
    assert proc.sent == []
    worker.replies.put({"event": "started"})
    assert job.poll() is None
    assert proc.sent == [signal.SIGUSR1]


def test_done_returns_the_jobs_code_and_the_worker_to_the_pool_and_later_signals_reach_nobody():
    job, worker, pool, proc = _rig()
    worker.replies.put({"event": "started"})
    worker.replies.put({"event": "done", "exit_code": 20, "resident": ["wan-tiny"]})
    assert job.poll() == 20 and job.poll() == 20
    assert pool.released == [worker] and worker.resident == ["wan-tiny"]
    job.signal(signal.SIGKILL)
    job.kill()
    assert proc.sent == [] and not job.group_alive()


def test_a_worker_that_dies_mid_job_fails_it_with_its_exit_status_and_is_discarded():
    job, worker, pool, proc = _rig()
    worker.replies.put({"event": "started"})
    assert job.poll() is None
    job.signal(signal.SIGKILL)
    worker.replies.put(None)  # EOF on its reply pipe
    assert job.poll() == -signal.SIGKILL
    assert pool.discarded == [worker] and pool.released == []


def test_a_worker_killed_as_its_job_ended_by_itself_keeps_the_jobs_code_and_is_never_reused():
    # the race a loaded CI runner hit: the runtime saw the fence and wrote "done"; before the agent read it, its
    # heartbeat saw the fence too and sent SIGKILL, which had not landed when the next job was handed out
    job, worker, pool, proc = _rig()
    proc.dies_at_once = False
    worker.replies.put({"event": "started"})
    assert job.poll() is None
    worker.replies.put({"event": "done", "exit_code": 50})  # written, not yet read
    job.signal(signal.SIGKILL)
    assert proc.sent == [signal.SIGKILL] and worker.doomed and worker.alive()
    assert job.poll() == 50  # the job's own outcome (FENCED), not the kill's
    assert pool.discarded == [worker] and pool.released == []


def test_a_batch_whose_worker_was_killed_discards_it_even_if_it_finished():
    clock = FakeClock()
    proc = FakeWorkerChild(clock, dies_at_once=False)
    worker = WarmWorker(key=(0,), child=proc)  # type: ignore[arg-type]
    worker.send = lambda request: None  # type: ignore[method-assign]
    pool = FakePool()
    run = BatchRun(pool, worker, ["a@1"], clock)  # type: ignore[arg-type]
    a = MemberChild(run, "a@1", lambda: "none", kill_grace_s=1.0)
    worker.replies.put({"event": "started"})
    a.signal(signal.SIGKILL)
    clock.advance(1.5)
    a.signal(signal.SIGKILL)  # still running after the grace: the worker is killed
    for reply in ({"event": "done", "id": "a@1", "exit_code": 50}, {"event": "batch_done"}):
        worker.replies.put(reply)
    assert a.poll() == 50
    assert pool.discarded == [worker] and pool.released == []


def test_batch_members_end_with_their_own_codes_and_stops_reach_only_their_member():
    clock = FakeClock()
    proc = FakeWorkerChild(clock)
    worker = WarmWorker(key=(0,), child=proc)  # type: ignore[arg-type]
    sent: list[dict] = []
    worker.send = sent.append  # type: ignore[method-assign]
    pool = FakePool()
    run = BatchRun(pool, worker, ["a@1", "b@1", "c@1"], clock)  # type: ignore[arg-type]
    reasons = {"a@1": "none", "b@1": "cancelled", "c@1": "drained"}
    a, b, c = (MemberChild(run, m, lambda m=m: reasons[m], kill_grace_s=2.0) for m in ("a@1", "b@1", "c@1"))
    worker.replies.put({"event": "started"})
    b.signal(signal.SIGTERM)
    b.signal(signal.SIGTERM)  # asked once
    c.signal(signal.SIGTERM)
    assert sent == [{"stop": "b@1", "reason": "CANCELLED"}, {"stop": "c@1", "reason": "PREEMPTED"}]
    worker.replies.put({"event": "done", "id": "b@1", "exit_code": 40, "gpu_seconds": 0.5})
    assert b.poll() == 40 and b.gpu_seconds == 0.5 and a.poll() is None
    b.signal(signal.SIGKILL)  # over: nothing sent
    a.signal(signal.SIGKILL)  # fenced: the member is asked to leave, the worker is not killed...
    assert sent[-1] == {"stop": "a@1", "reason": "FENCED"} and proc.sent == []
    clock.advance(2.5)
    a.signal(signal.SIGKILL)  # ...unless it is still running after the grace
    assert proc.sent == [signal.SIGKILL]
    worker.replies.put({"event": "done", "id": "c@1", "exit_code": 30, "gpu_seconds": 0.7})
    worker.replies.put(None)  # the killed worker's EOF: a, still running, ends with its status
    assert a.poll() == -signal.SIGKILL and c.poll() == 30
    assert pool.discarded == [worker] and pool.released == []


def test_a_finished_batch_returns_the_worker_to_the_pool():
    clock = FakeClock()
    worker = WarmWorker(key=(0,), child=FakeWorkerChild(clock))  # type: ignore[arg-type]
    pool = FakePool()
    run = BatchRun(pool, worker, ["a@1"], clock)  # type: ignore[arg-type]
    a = MemberChild(run, "a@1", lambda: "none", kill_grace_s=1.0)
    for reply in ({"event": "started"}, {"event": "done", "id": "a@1", "exit_code": 0, "gpu_seconds": 1.25},
                  {"event": "batch_done", "resident": ["wan-tiny"]}):
        worker.replies.put(reply)
    assert a.wait(1) == 0 and a.gpu_seconds == 1.25
    assert pool.released == [worker] and worker.resident == ["wan-tiny"] and not a.group_alive()


def test_every_reply_of_the_worker_wakes_the_runner_of_its_job():
    import io

    job, worker, _pool, proc = _rig()
    proc.proc.stdout = io.BytesIO(b'{"event": "started"}\nnot json\n{"event": "done", "exit_code": 0}\n')
    woken: list[int] = []
    job.notify_on_reply(lambda: woken.append(worker.replies.qsize()))
    worker.read_replies()
    # once per reply, each after it is queued (an unreadable line wakes no one), and at EOF
    assert woken == [1, 2, 3]
    assert [worker.replies.get_nowait() for _ in range(3)] == [{"event": "started"},
                                                                 {"event": "done", "exit_code": 0}, None]
