"""A node reports its GPUs free as soon as a job on them ends, not at its next periodic heartbeat: the scheduler counts a
GPU free only when its booking is released *and* the node's last report says it is free, so a stale report would keep
the GPU idle (or send the next job to another pool) for up to ``node_heartbeat_s``. Here that period is 60 s; the report
after the job's end must land within seconds."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


def test_a_job_that_ends_is_reported_free_at_once_not_at_the_next_beat(fleet):
    fleet.agent("node-f", node_heartbeat_s=60.0, node_ttl_s=120).start()
    first = fleet.node_item("node-f")["heartbeat_at"]  # the report at start
    fleet.submit("job-f1", STEPS=2)
    fleet.place("job-f1", "node-f", heartbeat_s=15)
    assert fleet.wait_execution("job-f1", 1)["status"] == "SUCCEEDED"
    deadline = time.monotonic() + 10
    while (item := fleet.node_item("node-f"))["heartbeat_at"] == first and time.monotonic() < deadline:
        time.sleep(0.1)
    assert item["heartbeat_at"] > first, "no report after the job ended (the next periodic one is 60 s away)"
    assert [g["milli_free"] for g in item["gpus"]] == [1000] and item["running_jobs"] == 0
