"""The runtime obeys the scheduler's job-item signals: ``preempt_requested`` for its epoch → checkpoint + PREEMPTED."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.scheduler.model import Allocation
from gpufleet.scheduler.store import request_preemption

pytestmark = pytest.mark.xdist_group("runtime-torch")


def _settings(tmp_path, tiny_cache) -> RuntimeSettings:
    return RuntimeSettings(state_dir=str(tmp_path), cache_dir=str(tiny_cache), checkpoint_every_steps=0,
                           progress_interval_s=0, log_flush_s=0, tiny_generate_side=32, torch_threads=1)


def _victim(job_id: str, epoch: int) -> Allocation:
    return Allocation(job_id=job_id, epoch=epoch, owner_path="acme/ml/ann", priority=0, pool="onprem-a",
                      gpu_type="A100", members=(), gpu_milli=1000, num_gpu=1)


def _run(aws, job_id, epoch, spec, settings) -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(aws.envelope(job_id, epoch, spec))], settings=settings, s3=aws.s3,
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
    assert b"preempted by the scheduler for job_urgent" in logs


def test_a_preemption_request_for_an_older_epoch_does_not_stop_the_next_attempt(aws, tiny_cache, tmp_path, rt):
    spec = rt.video_spec(steps=3)
    aws.put_job("job_old", 2, spec, preempt_requested={"epoch": 1, "by": "job_urgent", "at": "2026-11-30T07:00:00Z"})
    code, result = _run(aws, "job_old", 2, spec, _settings(tmp_path, tiny_cache))
    assert code == ExitCode.SUCCEEDED, result
    assert result["generated"] == aws.job("job_old")["generated"]
