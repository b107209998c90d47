"""The runtime and the job item: ``preempt_requested`` for its epoch → checkpoint + PREEMPTED; the worker moves
the job SCHEDULED→RUNNING (fenced) when the workload starts."""

from __future__ import annotations

import io
import json
import os
import threading
import time

import pytest

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.scheduler.model import Allocation
from gpufleet.store import jobs
from gpufleet.store.jobitem import JobItem
from gpufleet.store.placements import request_preemption

pytestmark = pytest.mark.xdist_group("runtime-torch")


def _settings(tmp_path, tiny_cache) -> RuntimeSettings:
    # the dev-mode step-delay test fault keeps a 200-step run mid-flight for ~3 s (bare, ~1 s): the preemption
    # request lands well before the last step, however loaded the runner
    return RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(tiny_cache), checkpoint_every_steps=0,
                           progress_interval_s=0, log_flush_s=0, tiny_generate_side=32, torch_threads=1,
                           dev_mode=True, fault_step_delay_s=0.01)


def _victim(job_id: str, epoch: int) -> Allocation:
    return Allocation(job_id=job_id, epoch=epoch, owner_path="acme/ml/ann", priority=0, pool="onprem-a",
                      gpu_type="A100", members=(), gpu_milli=1000, num_gpu=1)


def _run(aws, job_id, epoch, spec, settings, stage: str = "generate") -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(aws.envelope(job_id, epoch, spec, stage=stage))], settings=settings, s3=aws.s3,
                dynamodb=aws.ddb, stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_scheduler_preemption_checkpoints_at_once_and_exits_preempted(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=200)
    aws.put_job("job_pre", 1, spec)

    def preempt():  # the scheduler asks once generation is under way
        rt.wait_for(lambda: (aws.job("job_pre").get("progress") or {}).get("step", 0) >= 1, timeout=120,
                    interval=0.02)
        assert request_preemption(aws.ddb, aws.tables, _victim("job_pre", 1), "job_urgent", time.time())

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    code, result = _run(aws, "job_pre", 1, spec, _settings(tmp_path, tiny_cache))
    thread.join(5)
    assert code == ExitCode.PREEMPTED
    assert result["exit_code"] == "PREEMPTED"
    item = aws.job("job_pre")
    pointer = item["checkpoint"]
    assert 0 < pointer["step"] < 200 and pointer == result["checkpoint"]
    assert item["progress"]["step"] == pointer["step"]  # checkpointed at the step it stopped, nothing lost
    logs = b"".join(aws.get("bucket_logs", k) for k in aws.keys("bucket_logs", "jobs/job_pre/attempt-0001/"))
    assert b"preempted by the scheduler" in logs and b"job_urgent" not in logs  # never the other (tenant's) job


def test_a_preemption_request_for_an_older_epoch_does_not_stop_the_next_attempt(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=3)
    aws.put_job("job_old", 2, spec, preempt_requested={"epoch": 1, "by": "job_urgent", "at": "2026-11-30T07:00:00Z"})
    code, result = _run(aws, "job_old", 2, spec, _settings(tmp_path, tiny_cache))
    assert code == ExitCode.SUCCEEDED, result
    assert result["generated"] == aws.job("job_old")["generated"]


def test_job_is_running_while_the_workload_runs_and_the_move_is_on_the_timeline(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=200)
    aws.put_job("job_run", 1, spec, status="SCHEDULED")
    seen: dict = {}

    def watch():  # status while generation is under way, then stop the run early
        rt.wait_for(lambda: (aws.job("job_run").get("progress") or {}).get("step", 0) >= 1, timeout=120,
                    interval=0.02)
        seen.update(aws.job("job_run"))
        request_preemption(aws.ddb, aws.tables, _victim("job_run", 1), "job_urgent", time.time())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    before = time.time()
    code, _ = _run(aws, "job_run", 1, spec, _settings(tmp_path, tiny_cache))
    thread.join(5)
    assert code == ExitCode.PREEMPTED
    assert seen["status"] == "RUNNING" and before <= float(seen["running_since"]) <= time.time()
    moves = [e for e in jobs.list_events(aws.ddb, aws.tables.jobs, "job_run") if e["type"] == "status"]
    assert [(m["detail"]["from"], m["detail"]["to"], m["detail"]["epoch"]) for m in moves] == [
        (["SCHEDULED"], "RUNNING", 1)]


def test_a_stale_epoch_cannot_move_the_job_to_running(aws, rt):
    aws.put_job("job_stale", 2, rt.video_spec(), status="SCHEDULED")
    with pytest.raises(StaleEpoch):
        JobItem(aws.tables.jobs, "job_stale", 1, client=aws.ddb, clock=SystemClock()).mark_running()
    item = aws.job("job_stale")
    assert item["status"] == "SCHEDULED" and "running_since" not in item
    current = JobItem(aws.tables.jobs, "job_stale", 2, client=aws.ddb, clock=SystemClock())
    assert current.mark_running() is True
    assert current.mark_running() is False  # already RUNNING (a rerun of the same attempt): left as is
    assert aws.job("job_stale")["status"] == "RUNNING"


# Waits (at most 20 s) for the test to create $MARK, which it does once it has seen the job RUNNING (the test
# writes it into the attempt's checkpoint directory on the host, which the container sees at /job/checkpoint).
WAITER = """
import os, sys, time
deadline = time.monotonic() + 20
while not os.path.exists(os.environ["MARK"]):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.02)
"""


def test_container_job_is_running_while_its_command_runs(aws, tmp_path, rt, oci):
    spec = {"workload": {"kind": "container", "image": oci.image, "command": ["python3", "-c", WAITER],
                         "env": {"MARK": "/job/checkpoint/seen-running"}}, "resources": {"gpus": 1}}
    aws.put_job("job_crun", 1, spec, status="SCHEDULED")
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), log_flush_s=0,
                               **oci.settings)
    mark = settings.jobs_path / "job_crun" / "e0001" / "checkpoint" / "seen-running"

    def watch():
        rt.wait_for(lambda: aws.job("job_crun")["status"] == "RUNNING", timeout=20, interval=0.02)
        tmp = mark.parent.parent / "seen-running.tmp"  # owned by the podman user, then moved in at once
        tmp.write_text("1")
        os.chown(tmp, oci.podman.owner_uid, oci.podman.owner_gid)
        os.replace(tmp, mark)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    code, result = _run(aws, "job_crun", 1, spec, settings, stage="container")
    thread.join(5)
    assert code == ExitCode.SUCCEEDED, result
    assert aws.job("job_crun")["status"] == "RUNNING"
