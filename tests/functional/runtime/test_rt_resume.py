"""Interrupted generation resumed in a fresh process is bitwise identical to an uninterrupted run.

Each run is a new OS process forked from a pre-warmed server (no state survives
between runs), talking to a loopback moto server. Interruptions: SIGKILL
before the first checkpoint; SIGTERM mid-run, after which the newest checkpoint
is also corrupted (resume must fall back to the previous one); SIGTERM while the
last step is in flight; and a SIGTERM for a cancelled job (no checkpoint, CANCELLED).
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np

from gpufleet.envelope import ExitCode
from gpufleet.runtime.generate import unpack_output
from gpufleet.store import jobs

STEPS = 8


def _run(launcher, aws, rt, env, envelope, out, *, interrupt=None, before_signal=None):
    """Start the runtime; when ``interrupt=(sig, step)`` send ``sig`` once progress reaches ``step`` (after
    ``before_signal()``, if given)."""
    proc = launcher.start(["--envelope-json", json.dumps(envelope)], env, str(out))
    sent_at = None
    if interrupt:
        sig, at = interrupt
        rt.wait_for(lambda: any(e.get("event") == "progress" and e["step"] >= at for e in rt.read_events(out)),
                    timeout=120)
        sent_at = max(e["step"] for e in rt.read_events(out) if e.get("event") == "progress")
        if before_signal is not None:
            before_signal()
        os.kill(proc.pid, sig)
    proc.join(120)
    assert proc.exitcode is not None, "runtime did not exit"
    return proc.exitcode, sent_at


def _frames(aws, job_id):
    ref = aws.job(job_id)["generated"]
    frames, meta = unpack_output(aws.get("bucket_outputs", ref["key"]))
    return frames


def _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, job_id, spec, **settings):
    out2 = tmp_path / f"{job_id}-resume.jsonl"
    env = rt.child_env(endpoint, tiny_cache, tmp_path, **settings)
    code, _ = _run(launcher, aws, rt, env, aws.envelope(job_id, 2, spec), out2)
    assert code == ExitCode.SUCCEEDED, out2.read_text()
    resumed = [e for e in rt.read_events(out2) if e.get("event") == "resumed"]
    timeline = [e["detail"] for e in jobs.list_events(aws.ddb, aws.tables.jobs, job_id) if e["type"] == "resumed"]
    # the resume point is on the job's timeline too (fenced write of the resuming attempt)
    assert timeline == ([{"step": resumed[0]["step"], "key": resumed[0]["key"], "epoch": 2}] if resumed else [])
    return resumed[0]["step"] if resumed else None


def _next_attempt(aws, job_id):
    """What the lifecycle does before a retry: raise the epoch (the dead worker is fenced off)."""
    from gpufleet.store.fencing import issue_epoch

    issue_epoch(aws.ddb, aws.tables.jobs, job_id, 1)


def test_interrupted_generation_resumes_bitwise_identically_in_a_fresh_process(moto_server, launcher, tiny_cache,
                                                                               tmp_path, rt):
    # One test function on purpose: the scenarios share the pre-warmed launcher and the baseline, and
    # xdist's loadgroup does not keep separate tests on one worker with this pytest version.
    endpoint, aws = moto_server
    spec = rt.video_spec(steps=STEPS)

    # Baseline: an uninterrupted run.
    aws.put_job("job_base", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=0)
    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_base", 1, spec), tmp_path / "base.jsonl")
    assert code == ExitCode.SUCCEEDED
    expected = _frames(aws, "job_base")
    # the run's phase timings are on its attempt item (gpufleet.phases)
    phases = jobs.get_attempt(aws.ddb, aws.tables.jobs, "job_base", 1)["phases"]
    assert phases["started"] <= phases["model_loaded"] <= phases["first_step"] <= phases["generation_done"]
    assert phases["steps"] == STEPS and phases["model_cache"] in ("hit", "miss") and phases["mean_step_s"] > 0

    # 1. SIGKILL before the first checkpoint: nothing to resume from, the retry starts at step 0.
    aws.put_job("job_k0", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=100)
    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_k0", 1, spec), tmp_path / "k0.jsonl",
                   interrupt=(signal.SIGKILL, 1))
    assert code == -signal.SIGKILL
    assert "checkpoint" not in aws.job("job_k0")
    _next_attempt(aws, "job_k0")
    assert _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, "job_k0", spec) is None
    assert np.array_equal(_frames(aws, "job_k0"), expected), "restart after SIGKILL before the first checkpoint"

    # 2. SIGTERM mid-run (checkpoints every 2 steps): checkpoint at once, exit PREEMPTED. Then the newest
    #    checkpoint is corrupted: the resume falls back to the previous valid one. (The upload pacer takes a
    #    periodic checkpoint only after a clean step and within its budget, so the signal comes at step 6.)
    aws.put_job("job_corrupt", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=2)
    code, sent_at = _run(launcher, aws, rt, env, aws.envelope("job_corrupt", 1, spec), tmp_path / "c.jsonl",
                         interrupt=(signal.SIGTERM, 6))
    assert code == ExitCode.PREEMPTED
    pointer = aws.job("job_corrupt")["checkpoint"]
    assert pointer["step"] >= sent_at  # SIGTERM loses at most the step in flight
    older = sorted(k for k in aws.keys("bucket_checkpoints", "jobs/job_corrupt/checkpoints/") if k != pointer["key"])
    assert older, "periodic checkpoints were written before the SIGTERM"
    blob = bytearray(aws.get("bucket_checkpoints", pointer["key"]))
    blob[len(blob) // 2] ^= 0xFF
    aws.s3.put_object(Bucket=rt.BUCKETS["bucket_checkpoints"], Key=pointer["key"], Body=bytes(blob))
    _next_attempt(aws, "job_corrupt")
    step = _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, "job_corrupt", spec)
    assert step is not None and step < pointer["step"]
    assert np.array_equal(_frames(aws, "job_corrupt"), expected), "resume after falling back to an older checkpoint"

    # 3. SIGTERM while the last step is in flight: the checkpoint holds every completed step.
    aws.put_job("job_last", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=5)
    code, sent_at = _run(launcher, aws, rt, env, aws.envelope("job_last", 1, spec), tmp_path / "l.jsonl",
                         interrupt=(signal.SIGTERM, STEPS - 1))
    assert code == ExitCode.PREEMPTED
    pointer = aws.job("job_last")["checkpoint"]
    assert pointer["step"] >= sent_at >= STEPS - 1
    _next_attempt(aws, "job_last")
    assert _resume(launcher, aws, rt, endpoint, tiny_cache, tmp_path, "job_last", spec) == pointer["step"]
    assert np.array_equal(_frames(aws, "job_last"), expected), "resume after SIGTERM at the last step"

    # 4. A SIGTERM for a cancelled job (AWS Batch's TerminateJob, the API's cancel of a cloud job): the runtime reads
    #    the job once, exits CANCELLED and writes no checkpoint (before 2026-12-05: PREEMPTED, a checkpoint). No
    #    progress write reads the cancel first (one every 600 s).
    aws.put_job("job_tj", 1, spec)
    env = rt.child_env(endpoint, tiny_cache, tmp_path, checkpoint_every_steps=0, progress_interval_s=600)

    def cancel():
        aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_tj"}, "sk": {"S": "META"}},
                            UpdateExpression="SET cancel_requested = :t", ExpressionAttributeValues={":t": {"BOOL": True}})

    code, _ = _run(launcher, aws, rt, env, aws.envelope("job_tj", 1, spec), tmp_path / "tj.jsonl",
                   interrupt=(signal.SIGTERM, 3), before_signal=cancel)
    assert code == ExitCode.CANCELLED, (tmp_path / "tj.jsonl").read_text()[-1500:]
    assert "checkpoint" not in aws.job("job_tj")
