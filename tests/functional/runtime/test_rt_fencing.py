"""A worker whose epoch is stale cannot move the checkpoint pointer or the output, and exits FENCED."""

from __future__ import annotations

import io
import json

import pytest

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.errors import StaleEpoch
from gpufleet.runtime.checkpoint import AsyncCheckpointer, CheckpointStore
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.jobitem import JobItem
from gpufleet.store.objectstore import ObjectStore


def _store(aws, rt, job: JobItem, epoch: int) -> CheckpointStore:
    return CheckpointStore(ObjectStore(aws.s3), rt.BUCKETS["bucket_checkpoints"], f"jobs/{job.job_id}/", epoch,
                           lambda ref: job.set_checkpoint(ref.key, ref.sha256, ref.step))


def test_stale_worker_cannot_overwrite_checkpoint_pointer_or_output(aws, rt):
    aws.put_job("job_f", 1, rt.video_spec())
    old = JobItem(aws.tables.jobs, "job_f", 1, client=aws.ddb, clock=SystemClock())
    _store(aws, rt, old, 1).save(2, b"state at step 2")
    issue_epoch(aws.ddb, aws.tables.jobs, "job_f", 1)  # the job moved on: attempt 2 owns it
    new = JobItem(aws.tables.jobs, "job_f", 2, client=aws.ddb, clock=SystemClock())
    new_ref = _store(aws, rt, new, 2).save(3, b"state at step 3")
    new.set_generated({"key": "jobs/job_f/generated/e0002.npz", "sha256": "n" * 64})

    with pytest.raises(StaleEpoch):
        _store(aws, rt, old, 1).save(7, b"late state at step 7")
    with pytest.raises(StaleEpoch):
        old.set_generated({"key": "jobs/job_f/generated/e0001.npz", "sha256": "o" * 64})
    with pytest.raises(StaleEpoch):
        old.set_finalized({"blocked": False}, {"video_key": "stale.mp4", "manifest_key": "m", "watermark_payload": "0"})
    with pytest.raises(StaleEpoch):
        old.set_progress(7, 8)
    with pytest.raises(StaleEpoch):
        old.record_attempt({"staging": {"bytes_moved": 1}})
    item = aws.job("job_f")
    assert item["checkpoint"] == new_ref.as_item()
    assert item["generated"]["key"] == "jobs/job_f/generated/e0002.npz"
    assert not {"progress", "output", "moderation"} & set(item)
    # The stale blob went to its own epoch's key; the new epoch's blob is untouched.
    assert aws.get("bucket_checkpoints", new_ref.key) == b"state at step 3"


def test_async_checkpointer_surfaces_a_stale_epoch_to_the_compute_loop(aws, rt):
    aws.put_job("job_fa", 2, rt.video_spec())
    stale = JobItem(aws.tables.jobs, "job_fa", 1, client=aws.ddb, clock=SystemClock())
    writer = AsyncCheckpointer(_store(aws, rt, stale, 1), lambda snap: snap)
    writer.submit(1, b"x")
    writer.flush()
    with pytest.raises(StaleEpoch):
        writer.raise_error()
    writer.close()
    assert "checkpoint" not in aws.job("job_fa")


def test_runtime_with_a_stale_envelope_exits_fenced_and_writes_nothing(aws, rt, tmp_path):
    spec = rt.video_spec(steps=2)
    aws.put_job("job_fs", 3, spec)
    settings = RuntimeSettings(state_dir=str(tmp_path), log_flush_s=0, torch_threads=1)
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(aws.envelope("job_fs", 2, spec))], settings=settings, s3=aws.s3,
                dynamodb=aws.ddb, stdout=out, install_signals=False)
    assert code == ExitCode.FENCED
    assert json.loads(out.getvalue().splitlines()[-1])["exit_code"] == "FENCED"
    item = aws.job("job_fs")
    assert not {"progress", "checkpoint", "generated"} & set(item)
    assert aws.keys("bucket_outputs", "jobs/job_fs/") == []
