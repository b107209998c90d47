"""The warm worker's batch protocol, in process: a batch request runs both jobs, a ``stop`` line on stdin makes
one member leave (FENCED, no output) while the other succeeds, and the replies are ``started``, one ``done`` per
member with its GPU-seconds, then ``batch_done``; EOF ends the worker."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from gpufleet.envelope import ExitCode
from gpufleet.runtime import resident, worker

pytestmark = pytest.mark.xdist_group("runtime-torch")


def test_a_batch_request_runs_its_members_and_a_stop_line_fences_one(aws, rt, tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(resident, "RESIDENT", resident.ResidentModels())
    saved_env, saved_signals = dict(os.environ), (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    env = {**rt.AWS_ENV, "GPUFLEET_STATE_DIR": str(tmp_path / "state"), "GPUFLEET_CACHE_DIR": str(tiny_cache),
           "GPUFLEET_TINY_GENERATE_SIDE": "32", "GPUFLEET_PROGRESS_INTERVAL_S": "0", "GPUFLEET_LOG_FLUSH_S": "0",
           "GPUFLEET_TORCH_THREADS": "1", "GPUFLEET_CHECKPOINT_EVERY_STEPS": "50"}
    jobs = []
    for name, seed in (("wb_a", 1), ("wb_b", 2)):
        spec = rt.video_spec(f"a red fox {name}", width=64, height=64, frames=5, steps=30, seed=seed)
        aws.put_job(name, 1, spec)
        jobs.append({"id": f"{name}@1", "argv": ["--envelope-json", json.dumps(aws.envelope(name, 1, spec))],
                     "env": env, "log": str(tmp_path / f"{name}.log")})
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    own_log = os.open(tmp_path / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    replies: list[dict] = []

    def read_replies() -> None:
        with os.fdopen(rep_r, "r") as fh:
            for line in fh:
                replies.append(json.loads(line))

    reader = threading.Thread(target=read_replies, daemon=True)
    reader.start()
    requests = os.fdopen(req_w, "w", buffering=1)
    requests.write(json.dumps({"batch": jobs}) + "\n")

    def fence_b_then_close() -> None:
        deadline = time.monotonic() + 120
        while int((aws.job("wb_b").get("progress") or {}).get("step", 0)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        requests.write(json.dumps({"stop": "wb_b@1", "reason": "FENCED"}) + "\n")
        while not any(r.get("event") == "batch_done" for r in replies):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        requests.close()  # EOF: the worker ends

    steer = threading.Thread(target=fence_b_then_close, daemon=True)
    steer.start()
    try:
        with os.fdopen(req_r, "r") as requests_in:
            assert worker.serve(requests_in, rep_w, own_log) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        signal.signal(signal.SIGTERM, saved_signals[0])
        signal.signal(signal.SIGINT, saved_signals[1])
        os.close(rep_w)
        os.close(own_log)
    steer.join(10)
    reader.join(10)
    events = [r["event"] for r in replies]
    assert events[0] == "started" and events[-1] == "batch_done" and events.count("done") == 2, replies
    done = {r["id"]: r for r in replies if r["event"] == "done"}
    assert ExitCode(done["wb_a@1"]["exit_code"]) == ExitCode.SUCCEEDED
    assert ExitCode(done["wb_b@1"]["exit_code"]) == ExitCode.FENCED
    assert "generated" in aws.job("wb_a") and "generated" not in aws.job("wb_b")
    assert int(aws.job("wb_b")["progress"]["step"]) < 30
    assert all(r["gpu_seconds"] > 0 for r in done.values())
    assert replies[-1]["resident"] == ["wan-tiny"]
