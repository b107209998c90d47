"""The writer-process checkpointer against a loopback moto server, and the generate stage using it.

The child process builds its own clients from the environment, so these tests
use the ``moto_server`` fixture (in-process ``mock_aws`` is invisible to it).
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch
from gpufleet.runtime.checkpoint import AsyncCheckpointer, CheckpointStore
from gpufleet.runtime.ckptpace import UploadPacer
from gpufleet.runtime.ckptproc import CheckpointTarget, ProcessCheckpointer
from gpufleet.runtime.generate import unpack_output
from gpufleet.store.objectstore import ObjectStore, sha256_hex


@pytest.fixture
def server_env(moto_server, monkeypatch, rt):
    endpoint, aws = moto_server
    for k, v in {**rt.AWS_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    return aws


def _target(aws, rt, job_id: str, epoch: int) -> CheckpointTarget:
    return CheckpointTarget(rt.BUCKETS["bucket_checkpoints"], f"jobs/{job_id}/", epoch, aws.tables.jobs, job_id)


def _blob(step: int) -> bytes:
    return f"state after step {step} ".encode() * 1000


def test_each_snapshot_is_uploaded_hashed_and_pointed_to_when_the_writer_keeps_up(server_env, rt):
    aws = server_env
    aws.put_job("job_pw", 1, {})
    writer = ProcessCheckpointer(_target(aws, rt, "job_pw", 1), _blob, nice=0)
    try:
        for step in (1, 2, 3):
            writer.submit(step, step)
            assert writer.flush(60)
            writer.raise_error()
            assert aws.job("job_pw")["checkpoint"]["step"] == step
    finally:
        writer.close()
    assert (writer.written, writer.coalesced, writer.skipped, writer.submitted) == (3, 0, 0, 3)
    keys = aws.keys("bucket_checkpoints", "jobs/job_pw/checkpoints/")
    assert keys == [f"jobs/job_pw/checkpoints/{s:06d}-e0001.ckpt" for s in (1, 2, 3)]
    pointer = aws.job("job_pw")["checkpoint"]
    assert pointer == writer.last.as_item() and pointer["sha256"] == sha256_hex(_blob(3))
    store = CheckpointStore(ObjectStore(aws.s3), rt.BUCKETS["bucket_checkpoints"], "jobs/job_pw/", 1, lambda r: None)
    ref, data = store.load(pointer, lambda d: d)
    assert ref.step == 3 and data == _blob(3)


def test_a_burst_is_coalesced_to_the_newest_and_every_snapshot_is_accounted_for(server_env, rt):
    aws = server_env
    aws.put_job("job_pc", 1, {})
    writer = ProcessCheckpointer(_target(aws, rt, "job_pc", 1), _blob, nice=0)
    for step in range(1, 41):
        writer.submit(step, step)
    writer.close()
    writer.raise_error()
    assert writer.written + writer.coalesced + writer.skipped == writer.submitted == 40
    assert writer.skipped == 0 and writer.coalesced > 0  # 40 submissions in microseconds: most never start
    keys = aws.keys("bucket_checkpoints", "jobs/job_pc/checkpoints/")
    assert len(keys) == writer.written
    steps = [int(k.rsplit("/", 1)[1][:6]) for k in keys]
    assert max(steps) == 40 and writer.last.step == 40  # the newest snapshot is never dropped
    assert aws.job("job_pc")["checkpoint"]["step"] == 40


def test_the_writer_process_ignores_a_group_stop_signal_and_exits_when_closed(server_env, rt):
    aws = server_env
    aws.put_job("job_ps", 1, {})
    writer = ProcessCheckpointer(_target(aws, rt, "job_ps", 1), _blob, nice=0)
    assert writer.ready.wait(60)
    os.kill(writer.proc.pid, signal.SIGTERM)  # what systemd or a terminal sends to every process of the group
    writer.submit(1, 1)
    assert writer.flush(60)
    writer.raise_error()
    assert aws.job("job_ps")["checkpoint"]["step"] == 1
    writer.close()
    assert writer.proc.returncode == 0


def test_a_fenced_writer_process_surfaces_stale_epoch_and_writes_nothing_after(server_env, rt):
    aws = server_env
    aws.put_job("job_pf", 2, {})
    writer = ProcessCheckpointer(_target(aws, rt, "job_pf", 1), _blob, nice=0)
    writer.submit(1, 1)
    assert writer.flush(60)
    with pytest.raises(StaleEpoch):
        writer.raise_error()
    writer.submit(2, 2)
    writer.close()
    assert writer.written == 0 and writer.skipped == 2
    assert "checkpoint" not in aws.job("job_pf")
    # the stale worker's blob went under its own epoch's key; nothing of step 2 was uploaded
    assert aws.keys("bucket_checkpoints", "jobs/job_pf/checkpoints/") == ["jobs/job_pf/checkpoints/000001-e0001.ckpt"]


def test_a_dead_writer_process_is_an_error_and_flush_does_not_hang(server_env, rt):
    aws = server_env
    aws.put_job("job_pd", 1, {})
    writer = ProcessCheckpointer(_target(aws, rt, "job_pd", 1), _blob, nice=0)
    assert writer.ready.wait(60)
    os.kill(writer.proc.pid, signal.SIGKILL)
    rt.wait_for(lambda: writer.error is not None, timeout=30)
    writer.submit(1, 1)
    assert writer.flush(5)
    with pytest.raises(RuntimeError, match="exited"):
        writer.raise_error()
    writer.close(timeout=5)
    assert writer.skipped == 1 and writer.written == 0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_a_paced_writer_holds_uploads_back_while_over_budget_until_flush_or_max_lag(server_env, rt, kind):
    """Both async writers with an UploadPacer on a simulated clock: an upload that cost the loop a lot puts the
    pacer in debt, later snapshots wait (coalescing to the newest), flush sends the newest at once, and the
    max-lag rule uploads without a flush."""
    aws = server_env
    job_id = f"job_pp_{kind}"
    aws.put_job(job_id, 1, {})
    clock = _Clock()
    pacer = UploadPacer(0.05, max_lag_s=100.0, clock=clock)
    target = _target(aws, rt, job_id, 1)
    writer = (ProcessCheckpointer(target, _blob, nice=0, pacer=pacer) if kind == "process"
              else AsyncCheckpointer(target.build(), _blob, pacer=pacer))

    def step(seconds: float) -> None:
        clock.t += seconds
        writer.tick()

    try:
        for _ in range(4):  # the first tick starts the clock; clean steps make the baseline
            step(0.010)
        writer.submit(1, 1)
        rt.wait_for(lambda: writer.written == 1, timeout=30)  # allowed at once
        step(1.0)  # the step that overlapped the upload took 100x the baseline: ~1 s of debt
        for s in (2, 3, 4, 5):
            writer.submit(s, s)
            step(0.010)
        time.sleep(1.0)  # give a (wrongly) woken writer time to act: it must still be held back
        assert writer.written == 1 and pacer.credit < 0
        assert writer.flush(60)  # a drain ignores the pacer
        writer.raise_error()
        assert writer.written == 2 and writer.last.step == 5 and writer.coalesced == 3
        assert aws.job(job_id)["checkpoint"]["step"] == 5
        clock.t += 100.0  # the recovery point is now max_lag_s old: the next snapshot goes without a flush
        writer.submit(6, 6)
        rt.wait_for(lambda: writer.written == 3, timeout=30)
        assert aws.job(job_id)["checkpoint"]["step"] == 6 and pacer.credit < 0
    finally:
        writer.close()
    keys = aws.keys("bucket_checkpoints", f"jobs/{job_id}/checkpoints/")
    assert [int(k.rsplit("/", 1)[1][:6]) for k in keys] == [1, 5, 6]


def test_generate_with_the_process_writer_checkpoints_and_resumes_bitwise_identically(moto_server, launcher,
                                                                                      tiny_cache, tmp_path, rt):
    endpoint, aws = moto_server
    spec = rt.video_spec(steps=12)

    def run(job_id, epoch, out, interrupt_at=None, **settings):
        env = rt.child_env(endpoint, tiny_cache, tmp_path, **settings)
        proc = launcher.start(["--envelope-json", json.dumps(aws.envelope(job_id, epoch, spec))], env, str(out))
        if interrupt_at is not None:
            rt.wait_for(lambda: any(e.get("event") == "progress" and e["step"] >= interrupt_at
                                    for e in rt.read_events(out)), timeout=120)
            os.kill(proc.pid, signal.SIGTERM)
        proc.join(120)
        return proc.exitcode

    aws.put_job("job_pg_base", 1, spec)
    assert run("job_pg_base", 1, tmp_path / "base.jsonl", checkpoint_every_steps=0) == ExitCode.SUCCEEDED
    expected, _ = unpack_output(aws.get("bucket_outputs", aws.job("job_pg_base")["generated"]["key"]))

    aws.put_job("job_pg", 1, spec)
    code = run("job_pg", 1, tmp_path / "p1.jsonl", interrupt_at=4, checkpoint_every_steps=1,
               checkpoint_writer="process")
    assert code == ExitCode.PREEMPTED, (tmp_path / "p1.jsonl").read_text()
    keys = aws.keys("bucket_checkpoints", "jobs/job_pg/checkpoints/")
    pointer = aws.job("job_pg")["checkpoint"]
    assert keys and pointer["key"] == max(keys)  # how many periodic uploads got through depends on the load
    from gpufleet.store.fencing import issue_epoch

    issue_epoch(aws.ddb, aws.tables.jobs, "job_pg", 1)
    out2 = tmp_path / "p2.jsonl"
    assert run("job_pg", 2, out2, checkpoint_every_steps=1, checkpoint_writer="process") == ExitCode.SUCCEEDED
    resumed = [e for e in rt.read_events(out2) if e.get("event") == "resumed"]
    assert resumed and resumed[0]["step"] == pointer["step"]
    frames, _ = unpack_output(aws.get("bucket_outputs", aws.job("job_pg")["generated"]["key"]))
    assert np.array_equal(frames, expected)
    # The completed attempt's writer process uploaded its own checkpoints (which steps depends on the pacer and
    # the load) and flushed before exit: the pointer names the newest epoch-2 checkpoint in S3.
    mine = [k for k in aws.keys("bucket_checkpoints", "jobs/job_pg/checkpoints/") if k.endswith("-e0002.ckpt")]
    assert mine and aws.job("job_pg")["checkpoint"]["key"] == max(mine)
    assert int(max(mine).rsplit("/", 1)[1][:6]) > pointer["step"]
