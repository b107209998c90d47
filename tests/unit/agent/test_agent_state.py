"""The agent's state dir: running records, orphan reaping that never kills a stranger, completed records."""

from __future__ import annotations

import json
import os
import subprocess
import time

from gpufleet.clock import SystemClock
from onprem_agent.state import RunningRecord, StateDir, group_alive


def test_completed_records_and_pruning(tmp_path):
    st = StateDir(tmp_path, SystemClock())
    assert st.completed("job_x", 3) is None
    st.record_completed("job_x", 3, "SUCCEEDED", time.time())
    assert st.completed("job_x", 3) == "SUCCEEDED"
    assert st.completed("job_x", 4) is None
    old = st.completed_dir / "job_x@3.json"
    os.utime(old, (time.time() - 1000, time.time() - 1000))
    assert st.prune_completed(time.time() - 10) == 1
    assert st.completed("job_x", 3) is None


def test_reap_orphans_kills_the_recorded_group(tmp_path):
    st = StateDir(tmp_path, SystemClock())
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        st.record_running("job_o", 1, proc.pid, time.time())
        time.sleep(0.1)
        assert group_alive(proc.pid)
        reaped = st.reap_orphans()
        assert [r.job_id for r in reaped] == ["job_o"]
        proc.wait(5)
        assert not group_alive(proc.pid)
        assert st.running() == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_reap_orphans_leaves_a_recycled_pid_alone(tmp_path):
    st = StateDir(tmp_path, SystemClock())
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # a record whose pid now belongs to a different process (creation time differs)
        rec = RunningRecord("job_r", 2, proc.pid, proc.pid, create_time=123.0, started_at=0.0)
        (st.running_dir / "job_r@2.json").write_text(json.dumps(rec.__dict__))
        assert st.reap_orphans() == []
        assert proc.poll() is None
        assert st.running() == []
    finally:
        proc.kill()
        proc.wait()


def test_unreadable_records_and_live_agent_pid(tmp_path):
    st = StateDir(tmp_path, SystemClock())
    (st.running_dir / "junk@1.json").write_text("{not json")
    assert st.running() == []
    assert st.live_agent_pid() is None
    st.write_agent_pid(os.getpid())
    assert st.live_agent_pid() == os.getpid()
    st.pid_path.write_text(f"{os.getpid()} 12345.0")  # same pid, different process (recycled)
    assert st.live_agent_pid() is None
    st.write_status({"heartbeat_at": 5.0})
    assert st.read_status() == {"heartbeat_at": 5.0}
