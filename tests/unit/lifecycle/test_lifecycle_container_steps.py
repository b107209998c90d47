"""Container jobs through the lifecycle steps, over the in-memory stores (:mod:`gpufleet.store.fakes`; each fake's
contract runs on moto too): CompleteRun routes them to CollectOutputs (not finalize), CollectOutputs counts the
published files against the per-job cap and records ``output`` (fenced), Publish and Bill treat them as video
jobs; an oversize output fails the job as USER (billed the run), and a crash recorded identically on two workers
fails it as USER too."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpufleet.errors import Conflict, OutputTooLarge, StaleEpoch
from gpufleet.lifecycle import steps
from gpufleet.lifecycle.settings import Deps
from gpufleet.status import JobStatus as S
from gpufleet.tables import attempt_sk, job_pk

IMAGE = "localhost/gpufleet-test/tools:1"


def container_job(w) -> str:
    return w.new_job(spec={"workload": {"kind": "container", "image": IMAGE, "command": ["true"]}})["job_id"]


def place(w, job_id: str, node: str) -> dict:
    return w.place(job_id, node=node, attempt=True)


def run_and_publish_files(w, deps: Deps, job_id: str, p: dict, files: dict[str, bytes]) -> dict:
    """What the worker does (files under its epoch's prefix + the fenced pointer), then CompleteRun."""
    prefix = f"jobs/{job_id}/output/e{p['epoch']:04d}/"
    for name, data in files.items():
        w.outputs.put(prefix + name, data)
    deps.jobs.fenced_update(job_id, p["epoch"], {"generated": {"key": prefix, "sha256": "x", "files": len(files)}})
    state = {"job_id": job_id, "placement": p, "result": {"epoch": p["epoch"], "gpu_seconds": 36.0}}
    state["completed"] = {"value": steps.complete_run(deps, state)}
    return state


def test_container_job_collects_outputs_publishes_and_bills_once(world):
    deps = world.deps
    job_id = container_job(world)
    steps.await_placement(deps, job_id, "tok")
    p = place(world, job_id, "n1")
    run = steps.prepare_run(deps, {"job_id": job_id, "placement": p})
    assert run["envelope"]["stage"] == "container"
    assert run["workload"] == "container"  # the workflow's CloudWorkload reads it (RunCloudContainer on a cloud pool)
    assert run["envelope"]["s3"]["output_max_bytes"] == deps.settings.output_max_bytes
    state = run_and_publish_files(world, deps, job_id, p, {"a.txt": b"hello", "sub/b.bin": b"x" * 10})
    assert state["completed"]["value"]["workload"] == "container"
    assert state["completed"]["value"]["finalize_command"] == []  # never finalized
    assert state["completed"]["value"]["finalize_pixels"] == 0
    state["collected"] = {"value": steps.collect_outputs(deps, state)}
    assert state["collected"]["value"] == {"files": 2, "bytes": 15}
    job = deps.jobs.get(job_id)
    assert job["output"] == {"kind": "files", "prefix": f"jobs/{job_id}/output/e0001/", "files": 2, "bytes": 15}
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    billing = steps.bill(deps, job_id)
    assert billing["charged"] is True and billing["ledger_entry_written"] is True
    assert steps.bill(deps, job_id)["ledger_entry_written"] is False  # a retried Bill charges nothing twice
    assert len(deps.ledger.entries(job_id)) == 1


def test_collect_outputs_is_fenced_and_needs_the_attempts_pointer(world):
    deps = world.deps
    job_id = container_job(world)
    steps.await_placement(deps, job_id, "tok")
    p = place(world, job_id, "n1")
    state = {"job_id": job_id, "placement": p, "completed": {"value": {"epoch": p["epoch"]}}}
    with pytest.raises(Conflict):  # no output published for this epoch
        steps.collect_outputs(deps, state)
    deps.jobs.issue_epoch(job_id, p["epoch"])  # the attempt was fenced off
    with pytest.raises(StaleEpoch):
        steps.collect_outputs(deps, state)


def test_output_over_the_cap_fails_as_user_and_is_billed(world):
    small = dataclasses.replace(world.deps, settings=world.deps.settings.model_copy(update={"output_max_bytes": 100}))
    job_id = container_job(world)
    steps.await_placement(small, job_id, "tok")
    p = place(world, job_id, "n1")
    state = run_and_publish_files(world, small, job_id, p, {"big.bin": b"x" * 101})
    with pytest.raises(OutputTooLarge) as err:
        steps.collect_outputs(small, state)
    assert "101 bytes" in err.value.detail and "100 bytes" in err.value.detail
    state["error"] = {
        "Error": "OutputTooLarge",
        "Cause": json.dumps({"errorMessage": err.value.detail, "errorType": "OutputTooLarge"}),
    }
    decision = steps.classify_failure(small, state)
    assert decision["action"] == "fail" and decision["class"] == "USER" and decision["outcome"] == "USER_ERROR"
    job = small.jobs.get(job_id)
    assert job["status"] == "FAILED" and "per-job cap" in job["final"]["reason"] and "output" not in job
    billing = steps.bill(small, job_id)
    assert billing["charged"] is True and billing["gpu_seconds"] == 36.0  # the run the user asked for


def test_identical_crash_on_a_second_node_fails_as_user(world):
    deps = world.deps
    job_id = container_job(world)
    crash = {"exit_code": 139, "fingerprint": "f" * 32, "tail": ["boom"]}
    error = {"Error": "SYSTEM_ERROR", "Cause": json.dumps({"detail": "command killed by signal 11"})}
    decisions = []
    for node in ("n1", "n2"):
        steps.await_placement(deps, job_id, "tok")
        p = place(world, job_id, node)
        attempt = world.db.get("jobs", (job_pk(job_id), attempt_sk(p["epoch"])))
        world.db.put("jobs", {**attempt, "crash": crash})  # what the node API records
        deps.jobs.transition(job_id, [S.SCHEDULED], S.RUNNING)
        decisions.append(steps.classify_failure(deps, {"job_id": job_id, "placement": p, "error": error}))
    assert [d["class"] for d in decisions] == ["SYSTEM", "USER"]
    assert decisions[0]["action"] == "retry" and decisions[1]["action"] == "fail"
    assert decisions[1]["outcome"] == "USER_ERROR" and "deterministic crash" in decisions[1]["reason"]
    job = deps.jobs.get(job_id)
    assert job["status"] == "FAILED" and int(job["system_failures"]) == 1
    assert job["crashes"] == {"f" * 32 + "|n1", "f" * 32 + "|n2"}
    failed = [e["detail"] for e in deps.jobs.events(job_id) if e["type"] == "attempt_failed"]
    assert failed[0]["crash_fingerprint"] == "f" * 32
