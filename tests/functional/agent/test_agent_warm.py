"""Warm workers (``warm_workers = true``): the agent runs the platform's generate stage (the real runtime,
``wan-tiny`` on the CPU) on a long-lived worker per GPU set, under the same contract as a fresh process.

- Back to back on one worker: the second job finds the model resident (no ``model_loaded`` mark, so no
  model-load phase; ``model_cache`` "resident"), runs in the same process and generates the same frames
  for the same seed; the node advertises the resident model by name. A job for another model evicts it
  (the default budget keeps one), and the first model then loads again.
- Cancel, fencing and a worker SIGKILLed mid-job: CANCELLED; FENCED with no output from the stale epoch;
  a SYSTEM_ERROR attempt, and a fresh worker serves the next job. A drain checkpoints the job in the
  worker (PREEMPTED) and the agent exits 0 with its workers gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

import numpy as np
import psutil
import pytest
import requests

from gpufleet.runtime.generated import unpack_output
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.tables import attempt_sk, job_pk

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("runtime-torch")]


def _spec(model: str = "wan-tiny", steps: int = 3) -> dict:
    return {"workload": {"kind": "video.generate", "prompt": "a red fox", "model": model, "width": 64, "height": 64,
                         "frames": 5, "steps": steps, "seed": 7}, "resources": {"gpus": 1}}


def _agent(fleet, node: str, model_root, step_delay_s: float = 0.0):
    env = {"GPUFLEET_TINY_GENERATE_SIDE": "32", "GPUFLEET_TORCH_THREADS": "1", "GPUFLEET_PROGRESS_INTERVAL_S": "0",
           "GPUFLEET_LOG_FLUSH_S": "0.5", "GPUFLEET_CHECKPOINT_EVERY_STEPS": "50",
           "GPUFLEET_MODEL_ROOT": str(model_root)}
    if step_delay_s:  # the dev-mode test fault: each step that much longer, so a run stays mid-flight
        env |= {"GPUFLEET_DEV_MODE": "1", "GPUFLEET_FAULT_STEP_DELAY_S": str(step_delay_s)}
    return fleet.agent(node, warm_workers=True, runtime_command=[sys.executable, "-m", "gpufleet.runtime"],
                       child_env=env, heartbeat_interval_s=0.5, visibility_timeout_s=30).start()


def _run(fleet, job_id: str, node: str, spec: dict, timeout: float = 180) -> dict:
    fleet.submit(job_id, spec=spec)
    fleet.place(job_id, node, heartbeat_s=30, stage="generate")
    return fleet.wait_execution(job_id, 1, timeout=timeout)


def _phases(fleet, job_id: str, epoch: int = 1) -> dict:
    got = fleet.ddb.get_item(TableName=fleet.tables.jobs, ConsistentRead=True,
                             Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": attempt_sk(epoch)}})
    return unmarshal(got["Item"]).get("phases") or {}


def _pid(agent, job_id: str) -> int:
    return int(agent.wait_log("job started", job_id=job_id)["pid"])


def _frames(fleet, job_id: str) -> np.ndarray:
    key = fleet.job(job_id)["generated"]["key"]
    frames, _meta = unpack_output(fleet.s3.get_object(Bucket=fleet.bucket, Key=key)["Body"].read())
    return frames


def _wait_resident(fleet, node: str, want: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (fleet.node_item(node) or {}).get("resident_models") != want:
        assert time.monotonic() < deadline, fleet.node_item(node)
        time.sleep(0.1)


def _wait_progress(fleet, job_id: str, step: int = 1, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while int((fleet.job(job_id).get("progress") or {}).get("step", 0)) < step:
        assert time.monotonic() < deadline, fleet.job(job_id)
        time.sleep(0.05)


def test_back_to_back_jobs_share_a_resident_model_and_a_switch_evicts_it(fleet, tmp_path):
    a = _agent(fleet, "node-w", tmp_path / "models")

    first = _run(fleet, "job-w1", "node-w", _spec())
    assert first["status"] == "SUCCEEDED", (first, a.log.read_text()[-3000:])
    assert "model_loaded" in _phases(fleet, "job-w1")

    second = _run(fleet, "job-w2", "node-w", _spec())
    assert second["status"] == "SUCCEEDED", (second, a.log.read_text()[-3000:])
    p2 = _phases(fleet, "job-w2")
    assert "model_loaded" not in p2 and p2["model_cache"] == "resident" and "first_step" in p2, p2
    assert _pid(a, "job-w1") == _pid(a, "job-w2")  # the same worker process
    assert np.array_equal(_frames(fleet, "job-w1"), _frames(fleet, "job-w2"))  # same seed, same frames
    _wait_resident(fleet, "node-w", ["wan-tiny"])

    # another model (a copy published under another name) evicts the resident one
    shutil.copytree(fleet.root / "cache-node-w" / "models" / "wan-tiny", tmp_path / "models" / "wan-tiny-b")
    third = _run(fleet, "job-w3", "node-w", _spec("wan-tiny-b"))
    assert third["status"] == "SUCCEEDED", (third, a.log.read_text()[-3000:])
    assert "model_loaded" in _phases(fleet, "job-w3")
    _wait_resident(fleet, "node-w", ["wan-tiny-b"])
    fourth = _run(fleet, "job-w4", "node-w", _spec())
    assert fourth["status"] == "SUCCEEDED", (fourth, a.log.read_text()[-3000:])
    assert "model_loaded" in _phases(fleet, "job-w4")  # it had been evicted: loaded again
    assert _pid(a, "job-w4") == _pid(a, "job-w1")
    port = a.wait_log("agent started")["metrics_port"]
    scraped = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert 'gpufleet_agent_job_starts_total{process="warm"} 4.0' in scraped
    assert "gpufleet_agent_warm_workers 1.0" in scraped


def test_cancel_fencing_and_a_killed_worker_on_a_warm_worker(fleet, tmp_path):
    # each act lands mid-run: 200 bare tiny-model steps last ~1 s (less than a loaded runner may take to answer),
    # 15 ms more a step gives them ~4 s; every job but job-n ends early, so the suite pays little for it
    a = _agent(fleet, "node-k", tmp_path / "models", step_delay_s=0.015)

    # cancel: the runtime in the worker stops; the attempt is CANCELLED
    fleet.submit("job-c", spec=_spec(steps=200))
    fleet.place("job-c", "node-k", heartbeat_s=30, stage="generate")
    _wait_progress(fleet, "job-c")
    fleet.cancel("job-c")
    c = fleet.wait_execution("job-c", 1)
    assert c["status"] == "FAILED" and c["error"] == "CANCELLED", c

    # fencing: a newer epoch fences the attempt off; the stale epoch writes no output
    fleet.submit("job-f", spec=_spec(steps=200))
    fleet.place("job-f", "node-k", heartbeat_s=30, stage="generate")
    _wait_progress(fleet, "job-f")
    issue_epoch(fleet.ddb, fleet.tables.jobs, "job-f", 1)
    ended = a.wait_log("job ended", job_id="job-f")
    assert ended["outcome"] == "FENCED", ended
    assert "generated" not in fleet.job("job-f")

    # a worker SIGKILLed mid-job: the attempt is a SYSTEM failure; a fresh worker serves the next job
    fleet.submit("job-k", spec=_spec(steps=200))
    fleet.place("job-k", "node-k", heartbeat_s=30, stage="generate")
    _wait_progress(fleet, "job-k")
    killed = _pid(a, "job-k")
    os.kill(killed, signal.SIGKILL)
    k = fleet.wait_execution("job-k", 1)
    assert k["status"] == "FAILED" and k["error"] == "SYSTEM_ERROR", k
    after = _run(fleet, "job-n", "node-k", _spec())
    assert after["status"] == "SUCCEEDED", (after, a.log.read_text()[-3000:])
    assert _pid(a, "job-n") != killed
    assert a.proc.poll() is None

    # drain: SIGTERM reaches the job in the worker, which checkpoints and exits PREEMPTED; the agent then
    # stops its workers and exits 0
    fleet.submit("job-d", spec=_spec(steps=200))
    fleet.place("job-d", "node-k", heartbeat_s=30, stage="generate")
    _wait_progress(fleet, "job-d")
    worker = _pid(a, "job-d")
    a.signal(signal.SIGTERM)
    assert a.wait() == 0, a.log.read_text()[-3000:]
    d = fleet.wait_execution("job-d", 1)
    assert d["status"] == "FAILED" and d["error"] == "PREEMPTED", d
    assert fleet.job("job-d")["checkpoint"]["step"] >= 1
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
