"""Interrupted generation resumed in a fresh process is bitwise identical to an uninterrupted run.

Each run is a new OS process forked from a pre-warmed server (no state survives
between runs), talking to a loopback moto server. Interruptions: SIGKILL
before the first checkpoint, SIGTERM mid-run, SIGTERM while the last step is in
flight, and SIGKILL after checkpoints with the newest checkpoint corrupted.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime.generate import unpack_output

pytestmark = pytest.mark.xdist_group("runtime-resume")

STEPS = 8


def _run(launcher, aws, rt, env, envelope, out, *, interrupt=None):
    """Start the runtime; when ``interrupt=(sig, step)`` send ``sig`` once progress reaches ``step``."""
    proc = launcher.start(["--envelope-json", json.dumps(envelope)], env, str(out))
    sent_at = None
    if interrupt:
        sig, at = interrupt
        rt.wait_for(lambda: any(e.get("event") == "progress" and e["step"] >= at for e in rt.read_events(out)),
                    timeout=120)
        sent_at = max(e["step"] for e in rt.read_events(out) if e.get("event") == "progress")
        os.kill(proc.pid, sig)
    proc.join(120)
    assert proc.exitcode is not None, "runtime did not exit"
    return proc.exitcode, sent_at


def _frames(aws, job_id):
    ref = aws.job(job_id)["generated"]
    frames, meta = unpack_output(aws.get("bucket_outputs", ref["key"]))
    return frames


@pytest.fixture(scope="module")
def baseline(moto_server, launcher, tiny_cache, tmp_path_factory, rt):
    endpoint, aws = moto_server
    spec = rt.video_spec(steps=STEPS)
    aws.put_job("job_base", 1, spec)
    out = tmp_path_factory.mktemp("base") / "out.jsonl"
    env = rt.child_env(endpoint, tiny_cache, out.parent, checkpoint_every_steps=0)
    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_base", 1, spec), out)
    assert code == ExitCode.SUCCEEDED
    return spec, _frames(aws, "job_base")


def _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, job_id, spec, **settings):
    out2 = tmp_path / "resume.jsonl"
    env = rt.child_env(endpoint, tiny_cache, tmp_path, **settings)
    code, _ = _run(launcher, aws, rt, env, aws.envelope(job_id, 2, spec), out2)
    assert code == ExitCode.SUCCEEDED, out2.read_text()
    resumed = [e for e in rt.read_events(out2) if e.get("event") == "resumed"]
    return resumed[0]["step"] if resumed else None


def _next_attempt(aws, job_id):
    """What the lifecycle does before a retry: raise the epoch (the dead worker is fenced off)."""
    from gpufleet.store.fencing import issue_epoch

    issue_epoch(aws.ddb, aws.tables.jobs, job_id, 1)


def test_kill_before_first_checkpoint_restarts_from_zero_identically(moto_server, launcher, tiny_cache, tmp_path,
                                                                    baseline, rt):
    endpoint, aws = moto_server
    spec, expected = baseline
    aws.put_job("job_k0", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=100)
    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_k0", 1, spec), tmp_path / "a.jsonl",
                   interrupt=(signal.SIGKILL, 1))
    assert code == -signal.SIGKILL
    assert "checkpoint" not in aws.job("job_k0")
    _next_attempt(aws, "job_k0")
    assert _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, "job_k0", spec) is None
    assert np.array_equal(_frames(aws, "job_k0"), expected)


@pytest.mark.parametrize("at", [3, STEPS - 1], ids=["mid-run", "last-step-in-flight"])
def test_sigterm_checkpoints_now_and_resume_is_bitwise_identical(moto_server, launcher, tiny_cache, tmp_path,
                                                                 baseline, rt, at):
    endpoint, aws = moto_server
    spec, expected = baseline
    job_id = f"job_term{at}"
    aws.put_job(job_id, 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=5)
    code, sent_at = _run(launcher, aws, rt, env, aws.envelope(job_id, 1, spec), tmp_path / "a.jsonl",
                         interrupt=(signal.SIGTERM, at))
    assert code == ExitCode.PREEMPTED
    pointer = aws.job(job_id)["checkpoint"]
    # SIGTERM loses at most the step in flight: every step completed when it arrived is in the checkpoint.
    assert pointer["step"] >= sent_at
    _next_attempt(aws, job_id)
    assert _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, job_id, spec) == pointer["step"]
    assert np.array_equal(_frames(aws, job_id), expected)


def test_corrupt_newest_checkpoint_falls_back_to_previous(moto_server, launcher, tiny_cache, tmp_path, baseline, rt):
    endpoint, aws = moto_server
    spec, expected = baseline
    aws.put_job("job_corrupt", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=2)
    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_corrupt", 1, spec), tmp_path / "a.jsonl",
                   interrupt=(signal.SIGTERM, 5))
    assert code == ExitCode.PREEMPTED
    pointer = aws.job("job_corrupt")["checkpoint"]
    older = sorted(k for k in aws.keys("bucket_checkpoints", "jobs/job_corrupt/checkpoints/") if k != pointer["key"])
    assert older, "periodic checkpoints were written before the SIGTERM"
    blob = bytearray(aws.get("bucket_checkpoints", pointer["key"]))
    blob[len(blob) // 2] ^= 0xFF
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_checkpoints"], Key=pointer["key"], Body=bytes(blob))
    _next_attempt(aws, "job_corrupt")
    step = _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, "job_corrupt", spec)
    assert step is not None and step < pointer["step"]
    assert np.array_equal(_frames(aws, "job_corrupt"), expected)
