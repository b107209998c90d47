"""A cloud gang's main node ends the gang when another member recorded a failure (gpufleet.runtime.batchgang)."""

from __future__ import annotations

from gpufleet.envelope import ExitCode
from gpufleet.gang import GangRole, batch_member_record, failed_member
from gpufleet.runtime.batchgang import GangWatch
from gpufleet.runtime.control import RunControl


def _rec(rank: int, state: str) -> dict:
    role = GangRole(rank=rank, world_size=3, nodes=["j#0", "j#1", "j#2"], master_addr="10.0.0.1", master_port=29500)
    return batch_member_record(role, state)


def test_the_first_failed_other_member_is_found():
    assert failed_member({}, 3, own_rank=0) is None  # nothing recorded yet
    assert failed_member({**_rec(1, "running"), **_rec(2, "succeeded")}, 3, own_rank=0) is None
    assert failed_member({**_rec(0, "system_error"), **_rec(1, "running")}, 3, own_rank=0) is None  # its own
    assert failed_member({**_rec(1, "user_error"), **_rec(2, "preempted")}, 3, own_rank=0) == (1, "user_error")


def test_the_watch_stops_the_main_node_with_the_failed_member_code():
    reads = [{**_rec(1, "running")}, RuntimeError("throttled"), {**_rec(1, "running"), **_rec(2, "user_error")}]

    def read():
        got = reads.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    control = RunControl()
    watch = GangWatch(read, 3, control, interval_s=60)
    assert watch.check() is False and watch.check() is False  # a running member; a failed read is tried again
    assert watch.check() is True
    assert control.stop_reason() is ExitCode.USER_ERROR and control.detail == "gang member 2 ended user_error"
    other = RunControl()
    GangWatch(lambda: _rec(1, "lost_worker_xyz"), 3, other, interval_s=60).check()
    assert other.stop_reason() is ExitCode.SYSTEM_ERROR  # a state naming no exit code


def test_the_watch_thread_looks_every_interval_until_stopped():
    control = RunControl()
    looks = []
    watch = GangWatch(lambda: looks.append(1) or _rec(1, "preempted"), 3, control, interval_s=0.01).start()
    assert control.stop_event.wait(5)
    watch.stop()
    assert control.stop_reason() is ExitCode.PREEMPTED and looks
