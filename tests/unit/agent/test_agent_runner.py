"""A JobRunner driven through fake ports, a fake child and a fake clock (no agent, no AWS, no process):
the heartbeat cadence while a job runs, and a cancel that the job ignores ending in the cancel's signal (SIGUSR1)
then SIGKILL."""

from __future__ import annotations

import dataclasses
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.clock import FakeClock
from gpufleet.envelope import Envelope
from gpufleet.gang import GangRole
from gpufleet.placement import Placement
from onprem_agent.aws import JobView, Message, TaskGone
from onprem_agent.metrics import AgentMetrics
from onprem_agent.runner import JobRunner, Lease, RunnerPorts, RunnerSettings, request_for
from onprem_agent.slots import GpuSlots, Request

T0 = 1_000.0


@dataclass
class FakeQueue:
    calls: list[tuple[str, str, int | None]] = field(default_factory=list)

    def extend(self, receipt: str, seconds: int) -> bool:
        self.calls.append(("extend", receipt, seconds))
        return True

    def release(self, receipt: str) -> bool:
        self.calls.append(("release", receipt, None))
        return True

    def delete(self, receipt: str) -> None:
        self.calls.append(("delete", receipt, None))


@dataclass
class FakeReports:
    """The node API as the runner sees it: the attempt's heartbeat answers the job's view (``cancel_at``, fake
    time, is when someone sets ``cancel_requested``); reports are recorded as the server sends them to the
    workflow (it adds the job's ``generated`` pointer and names the calling node)."""

    clock: FakeClock
    epoch: int
    cancel_at: float | None = None
    node: str = "node-u"
    generated: dict = field(default_factory=lambda: {"k": "v"})
    beats: list[float] = field(default_factory=list)
    reports: list[tuple[str, object, str]] = field(default_factory=list)
    release_at: float | None = None  # a gang's barrier opens then (None: not a gang)
    gone_at: float | None = None  # the server answers 410 from then on (the gang failed)

    def heartbeat(self, job_id: str, epoch: int) -> JobView:
        self.beats.append(self.clock.now())
        if self.gone_at is not None and self.clock.now() >= self.gone_at:
            raise TaskGone("the gang failed")
        cancelled = self.cancel_at is not None and self.clock.now() >= self.cancel_at
        released = None if self.release_at is None else self.clock.now() >= self.release_at
        return JobView(exists=True, current_epoch=self.epoch, cancel_requested=cancelled, generated=self.generated,
                       gang_released=released)

    def succeed(self, job_id: str, epoch: int, gpu_seconds: float) -> None:
        output = {"epoch": epoch, "gpu_seconds": gpu_seconds, "generated": self.generated}
        self.reports.append(("success", (job_id, epoch), json.dumps(output)))

    def fail(self, job_id: str, epoch: int, error: str, detail: str) -> None:
        self.reports.append(("failure", error, json.dumps({"epoch": epoch, "node": self.node, "detail": detail})))


@dataclass
class FakeRecords:
    root: Path
    completed: list[tuple[str, int, str, float]] = field(default_factory=list)
    running: list[tuple[str, int, int, float]] = field(default_factory=list)

    def envelope_path(self, job_id: str, epoch: int) -> Path:
        return self.root / f"{job_id}@{epoch}.json"

    def log_path(self, job_id: str, epoch: int) -> Path:
        return self.root / f"{job_id}@{epoch}.log"

    def record_running(self, job_id: str, epoch: int, pid: int, now: float) -> None:
        self.running.append((job_id, epoch, pid, now))

    def clear_running(self, job_id: str, epoch: int) -> None:
        self.running = [r for r in self.running if r[:2] != (job_id, epoch)]

    def record_completed(self, job_id: str, epoch: int, outcome: str, now: float) -> None:
        self.completed.append((job_id, epoch, outcome, now))


class FakeChild:
    """A worker that exits 0 at ``exit_at`` (fake time), ignores SIGTERM and dies on SIGKILL."""

    pid = 4242

    def __init__(self, clock: FakeClock, exit_at: float | None) -> None:
        self.clock = clock
        self.exit_at = exit_at
        self.signals: list[tuple[int, float]] = []
        self.rc: int | None = None

    def poll(self) -> int | None:
        if self.rc is None and self.exit_at is not None and self.clock.now() >= self.exit_at:
            self.rc = 0
        return self.rc

    def signal(self, sig: int) -> None:
        self.signals.append((sig, self.clock.now()))
        if sig == signal.SIGKILL:
            self.rc = -signal.SIGKILL

    def group_alive(self) -> bool:
        return False

    def kill(self) -> None:
        self.signal(signal.SIGKILL)


def _envelope() -> Envelope:
    return Envelope.model_validate({
        "job_id": "job_r1", "attempt": 3, "epoch": 3, "stage": "container",
        "spec": {"workload": {"kind": "container", "image": "busybox", "command": ["true"]}, "resources": {"gpus": 1}},
        "s3": {"bucket_outputs": "b", "bucket_checkpoints": "b", "bucket_logs": "b", "output_prefix": "jobs/job_r1/",
               "checkpoint_prefix": "jobs/job_r1/", "log_prefix": "jobs/job_r1/attempt-0003/"},
    })


@dataclass
class Rig:
    clock: FakeClock
    queue: FakeQueue
    tokens: FakeReports
    records: FakeRecords
    metrics: AgentMetrics
    child: FakeChild
    ports: RunnerPorts
    spawned: list[dict] = field(default_factory=list)
    events: list[tuple[str, float]] = field(default_factory=list)


def _rig(tmp_path: Path, *, exit_at: float | None, cancel_at: float | None = None) -> Rig:
    clock = FakeClock(T0)
    queue, tokens = FakeQueue(), FakeReports(clock, epoch=3, cancel_at=cancel_at)
    records, metrics, child = FakeRecords(tmp_path), AgentMetrics(), FakeChild(clock, exit_at)
    spawned: list[dict] = []
    events: list[tuple[str, float]] = []

    def spawn(command, envelope_file, env, log_file, cwd, *, clock, orphan_signal):
        spawned.append({"command": command, "envelope": json.loads(Path(envelope_file).read_text()), "env": env,
                        "cwd": cwd, "orphan_signal": orphan_signal})
        return child

    settings = RunnerSettings(
        node_id="node-u", runtime_command=("worker",), work_dir=tmp_path, cache_dir=tmp_path / "cache",
        heartbeat_interval_s=10.0, visibility_timeout_s=120, cancel_grace_s=2.0, drain_timeout_s=600.0,
    )
    ports = RunnerPorts(
        settings=settings, queue=queue, reports=tokens, records=records, metrics=metrics, clock=clock,
        base_env={"PATH": "/bin", "GPUFLEET_AGENT_POOL": "hidden"}, extra_env={"GPUFLEET_NODE_ID": "node-u"},
        real_gpus=True, draining=lambda: False,
        started=lambda runner, at: events.append(("started", at)),
        finished=lambda runner: events.append(("finished", clock.now())),
        gpus_free=lambda runner: events.append(("gpus_free", len(tokens.reports))),
        spawn=spawn,
    )
    return Rig(clock, queue, tokens, records, metrics, child, ports, spawned, events)


def _runner(rig: Rig) -> JobRunner:
    env = _envelope()
    msg = Message(message_id="m1", receipt="r1", body=env.model_dump_json(), sent_at=T0 - 5, receive_count=1)
    return JobRunner(rig.ports, env, Lease(message=msg, receipt="r1"), [1], request_for(env))


def test_heartbeats_follow_the_interval_and_success_is_reported(tmp_path):
    rig = _rig(tmp_path, exit_at=T0 + 35)
    runner = _runner(rig)
    runner.run()  # in this thread: the fake clock drives every wait

    # one pre-flight heartbeat, then one per heartbeat_interval_s until the child exits at +35 s
    assert rig.tokens.beats[0] == T0
    gaps = [b - a for a, b in zip(rig.tokens.beats, rig.tokens.beats[1:], strict=False)]
    assert len(gaps) == 3 and all(g == pytest.approx(10.0, abs=0.06) for g in gaps), rig.tokens.beats
    # each beat also extends the message's visibility
    assert [c for c in rig.queue.calls if c[0] == "extend"] == [("extend", "r1", 120)] * 3

    (spawned,) = rig.spawned
    assert spawned["command"] == ["worker"] and spawned["envelope"]["job_id"] == "job_r1"
    assert spawned["env"]["CUDA_VISIBLE_DEVICES"] == "1" and spawned["env"]["GPUFLEET_NODE_ID"] == "node-u"
    assert "GPUFLEET_AGENT_POOL" not in spawned["env"] and spawned["orphan_signal"] == signal.SIGTERM

    (kind, attempt, output) = rig.tokens.reports[0]
    assert (kind, attempt) == ("success", ("job_r1", 3)) and len(rig.tokens.reports) == 1
    out = json.loads(output)
    assert out["epoch"] == 3 and out["generated"] == {"k": "v"}
    assert out["gpu_seconds"] == pytest.approx(35.0, abs=0.06)
    # reported, then recorded completed, then the message deleted, then the runner finished; the GPUs were
    # given back as soon as the child was gone, before the report (0 reports sent then)
    assert rig.records.completed[0][:3] == ("job_r1", 3, "SUCCEEDED") and rig.records.running == []
    assert rig.queue.calls[-1] == ("delete", "r1", None)
    assert [e[0] for e in rig.events] == ["started", "gpus_free", "finished"] and rig.events[0][1] == T0
    assert rig.events[1] == ("gpus_free", 0)
    assert rig.child.signals == [] and not (tmp_path / "job_r1@3.json").exists()
    assert rig.metrics.registry.get_sample_value("gpufleet_agent_jobs_total", {"outcome": "SUCCEEDED"}) == 1


def test_cancel_sends_the_cancel_signal_then_sigkill_after_the_grace(tmp_path):
    rig = _rig(tmp_path, exit_at=None, cancel_at=T0 + 15)  # a worker that never exits on its own
    runner = _runner(rig)
    runner.run()

    # the cancel is seen at the first heartbeat after +15 s (about +20 s): SIGUSR1, which the runtime takes for a
    # cancel (not SIGTERM, a drain's: it would stop a container with the long grace); SIGKILL cancel_grace_s later
    (term, term_at), (kill, kill_at) = rig.child.signals[:2]
    assert (term, kill) == (signal.SIGUSR1, signal.SIGKILL)
    assert term_at == pytest.approx(T0 + 20, abs=0.1)
    assert kill_at - term_at == pytest.approx(2.0, abs=0.06)
    assert runner.stop_reason.value == "cancelled"
    (kind, error, cause) = rig.tokens.reports[0]
    assert (kind, error) == ("failure", "CANCELLED") and json.loads(cause)["node"] == "node-u"
    assert rig.records.completed[0][2] == "CANCELLED"
    assert rig.queue.calls[-1] == ("delete", "r1", None) and [e[0] for e in rig.events][-2:] == ["gpus_free", "finished"]


def test_check_now_heartbeats_at_once_so_a_nudged_cancel_is_not_left_to_the_next_beat(tmp_path):
    """A cancel nudge (the node's signal queue) makes the runner heartbeat now: the cancel at +15 s is signalled at
    +16 s, when the nudge came, not at the +20 s beat; a nudge with no cancel behind it only costs a heartbeat."""
    rig = _rig(tmp_path, exit_at=None, cancel_at=T0 + 15)
    runner = _runner(rig)
    poll, nudged = rig.child.poll, []

    def nudge_at_12_and_16():
        for at in (T0 + 12, T0 + 16):
            if rig.clock.now() >= at and at not in nudged:
                nudged.append(at)
                runner.check_now()
        return poll()

    rig.child.poll = nudge_at_12_and_16  # type: ignore[method-assign]
    runner.run()
    (usr1, usr1_at), (kill, _) = rig.child.signals[:2]
    assert (usr1, kill) == (signal.SIGUSR1, signal.SIGKILL)
    assert usr1_at == pytest.approx(T0 + 16, abs=0.1)
    assert runner.stop_reason.value == "cancelled"
    assert rig.tokens.reports[0][:2] == ("failure", "CANCELLED")


def test_a_cancel_during_a_drain_is_signalled_and_its_shorter_grace_applies(tmp_path):
    rig = _rig(tmp_path, exit_at=None, cancel_at=T0 + 15)  # never exits on its own: a drain that would take 600 s
    runner = _runner(rig)
    beat = rig.tokens.heartbeat

    def drain_at_the_first_beat_while_running(job_id: str, epoch: int) -> JobView:
        if rig.clock.now() >= T0 + 10:
            runner.request_drain()
        return beat(job_id, epoch)

    rig.tokens.heartbeat = drain_at_the_first_beat_while_running  # type: ignore[method-assign]
    runner.run()

    # drained at +10 s (SIGTERM), the cancel seen at +20 s (SIGUSR1), SIGKILL cancel_grace_s after the cancel,
    # not at the drain's deadline (+610 s)
    assert [(sig, round(at - T0)) for sig, at in rig.child.signals[:3]] == [
        (signal.SIGTERM, 10), (signal.SIGUSR1, 20), (signal.SIGKILL, 22)]
    assert runner.stop_reason.value == "cancelled" and rig.tokens.reports[0][:2] == ("failure", "CANCELLED")


def _placed(gpus: float, indices: list[int], milli: int) -> Envelope:
    env = _envelope()
    spec = env.spec.model_copy(update={"resources": env.spec.resources.model_copy(update={"gpus": gpus})})
    return env.model_copy(update={"spec": spec, "placement": Placement(epoch=3, attempt=3, node="n",
                                                                       gpu_indices=indices, gpu_milli=milli)})


def test_a_two_gpu_placement_requests_exactly_its_two_devices():
    req = request_for(_placed(2, [1, 3], 1000))  # the placement's gpu_milli is per GPU
    assert (req.indices, req.milli, req.device_count()) == ((1, 3), 2000, 2)
    slots = GpuSlots([0, 1, 2, 3])
    slots.check(req)
    assert slots.acquire("j@3", req) == [1, 3]
    assert request_for(_placed(0.25, [2], 250)) == Request(indices=(2,), milli=250)
    assert request_for(_placed(2, [], 1000)).milli == 2000  # no indices named: the allocator picks two


def _gang_runner(rig: Rig) -> JobRunner:
    env = _envelope()
    role = GangRole(rank=1, world_size=2, nodes=["node-t", "node-u"], master_addr="node-t", master_port=29501)
    env = env.model_copy(update={"gang": role})
    msg = Message(message_id="m1", receipt="r1", body=env.model_dump_json(), sent_at=T0 - 5, receive_count=1)
    return JobRunner(rig.ports, env, Lease(message=msg, receipt="r1"), [1], request_for(env))


def test_a_gang_member_starts_only_when_the_barrier_opens_and_gets_the_torchrun_variables(tmp_path):
    rig = _rig(tmp_path, exit_at=T0 + 45)
    rig.tokens.release_at = T0 + 25  # the other member arrives at +25 s
    _gang_runner(rig).run()
    (spawned,) = rig.spawned
    assert rig.events[0] == ("started", pytest.approx(T0 + 30, abs=0.1))  # the first beat after +25 s
    assert {k: spawned["env"][k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")} == {
        "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node-t", "MASTER_PORT": "29501", "LOCAL_RANK": "0"}
    assert rig.tokens.reports[0][0] == "success"


def test_a_gang_released_at_the_barrier_never_starts_and_reports_nothing(tmp_path):
    rig = _rig(tmp_path, exit_at=T0 + 45)
    rig.tokens.release_at, rig.tokens.gone_at = T0 + 1000, T0 + 20  # the barrier timed out on the server
    _gang_runner(rig).run()
    assert rig.spawned == [] and rig.tokens.reports == []
    assert rig.records.completed[0][:3] == ("job_r1", 3, "ABANDONED") and rig.queue.calls[-1][0] == "delete"


def test_a_started_gang_member_is_stopped_when_the_gang_fails(tmp_path):
    rig = _rig(tmp_path, exit_at=None)
    rig.tokens.release_at, rig.tokens.gone_at = T0, T0 + 30  # another member failed at +30 s
    _gang_runner(rig).run()
    assert len(rig.spawned) == 1 and [s for s, _t in rig.child.signals] == [signal.SIGKILL] and rig.tokens.reports == []


def _failing_gang_member(tmp_path: Path, hold_s: float) -> Rig:
    rig = _rig(tmp_path, exit_at=T0 + 20)
    rig.child.poll = lambda: 10 if rig.clock.now() >= T0 + 20 else None  # USER_ERROR by itself at +20 s
    rig.tokens.release_at = T0
    settings = dataclasses.replace(rig.ports.settings, gang_failure_hold_s=hold_s)
    rig.ports = dataclasses.replace(rig.ports, settings=settings)
    return rig


def test_a_gang_members_own_failure_is_held_and_dropped_when_the_gang_fails_meanwhile(tmp_path):
    rig = _failing_gang_member(tmp_path, hold_s=110)
    rig.tokens.gone_at = T0 + 60  # a peer went silent at ~+15 s: the server fails the gang at +60 s
    _gang_runner(rig).run()
    assert rig.tokens.reports == []  # a lost peer's gang: retried as a unit, not this member's error
    assert ("gpus_free", 0) in rig.events  # its GPUs went back when its process ended
    assert rig.records.completed[0][:3] == ("job_r1", 3, "ABANDONED") and rig.queue.calls[-1][0] == "delete"
    assert max(rig.tokens.beats) == pytest.approx(T0 + 60, abs=0.1)


def test_a_gang_members_own_failure_is_reported_after_the_hold_while_every_member_lives(tmp_path):
    rig = _failing_gang_member(tmp_path, hold_s=110)
    _gang_runner(rig).run()
    (report,) = rig.tokens.reports
    assert report[:2] == ("failure", "USER_ERROR")
    assert rig.clock.now() >= T0 + 20 + 110 and max(rig.tokens.beats) < T0 + 20 + 110
    rig = _failing_gang_member(tmp_path / "x", hold_s=0)  # no hold: reported at once
    (tmp_path / "x").mkdir()
    _gang_runner(rig).run()
    assert rig.tokens.reports[0][:2] == ("failure", "USER_ERROR") and rig.clock.now() < T0 + 31


def test_a_job_past_its_max_run_seconds_is_stopped_like_a_cancel_and_reported_timed_out(tmp_path):
    rig = _rig(tmp_path, exit_at=None)  # a worker that never exits on its own and ignores SIGTERM
    env = _envelope()
    env = env.model_copy(update={"spec": env.spec.model_copy(update={"max_run_seconds": 25})})
    msg = Message(message_id="m1", receipt="r1", body=env.model_dump_json(), sent_at=T0 - 5, receive_count=1)
    runner = JobRunner(rig.ports, env, Lease(message=msg, receipt="r1"), [1], request_for(env))
    runner.run()

    (term, term_at), (kill, kill_at) = rig.child.signals[:2]
    assert (term, kill) == (signal.SIGUSR2, signal.SIGKILL)  # the time limit's own signal
    assert term_at == pytest.approx(T0 + 25, abs=0.1)  # at the limit, not at a heartbeat
    assert kill_at - term_at == pytest.approx(2.0, abs=0.06)  # cancel_grace_s
    assert runner.stop_reason.value == "timed_out"
    (kind, error, cause) = rig.tokens.reports[0]
    assert (kind, error) == ("failure", "TIMED_OUT")
    assert "maximum run time of 25 s exceeded" in json.loads(cause)["detail"]
    assert rig.records.completed[0][2] == "TIMED_OUT" and rig.queue.calls[-1] == ("delete", "r1", None)


def test_a_job_that_ends_within_its_max_run_seconds_is_not_stopped(tmp_path):
    rig = _rig(tmp_path, exit_at=T0 + 20)
    env = _envelope()
    env = env.model_copy(update={"spec": env.spec.model_copy(update={"max_run_seconds": 25})})
    msg = Message(message_id="m1", receipt="r1", body=env.model_dump_json(), sent_at=T0 - 5, receive_count=1)
    JobRunner(rig.ports, env, Lease(message=msg, receipt="r1"), [1], request_for(env)).run()
    assert rig.child.signals == [] and rig.tokens.reports[0][0] == "success"
