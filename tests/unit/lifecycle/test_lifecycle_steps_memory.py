"""Lifecycle task steps, ledger and cancellation over the in-memory stores (``conftest.World``). The steps that
talk to SQS or AWS Batch themselves (the happy path's webhook filter, Notify, the Batch cancel) stay on moto:
tests/functional/lifecycle/test_lifecycle_steps.py."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from gpufleet.batchdef import ATTEMPT_MARGIN_SECONDS
from gpufleet.errors import Cancelled, StaleEpoch
from gpufleet.lifecycle import cancel, steps
from gpufleet.lifecycle.billing import Charge, Outcome
from gpufleet.metrics import RecordingMetrics
from gpufleet.status import JobStatus as S
from gpufleet.store.fakes.workflow import MemoryEventBus, MemoryTaskTokens
from gpufleet.tables import pending_partition


def test_prompt_check_and_rejection_not_charged(world):
    deps, job = world.deps, world.new_job("something forbidden")
    state = {"job_id": job["job_id"], "prompt": {"value": steps.check_prompt(deps, {"job_id": job["job_id"]})}}
    assert state["prompt"]["value"]["allowed"] is False
    steps.mark_terminal(deps, state, "REJECTED")
    billing = steps.bill(deps, job["job_id"])
    assert billing["charged"] is False and "rejected" in billing["waiver"]
    assert deps.ledger.entries(job["job_id"]) == []


def test_await_placement_parks_and_refuses_after_cancel(world):
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok-1")
    parked = deps.jobs.get(job["job_id"])
    assert parked["status"] == "PENDING" and parked["placement_token"] == "tok-1"
    assert parked["gsi3pk"] == pending_partition(parked["job_id"])
    deps.jobs.request_cancel(job["job_id"])
    with pytest.raises(Cancelled):
        steps.await_placement(deps, job["job_id"], "tok-2")


def test_await_placement_on_a_pending_job_replaces_its_token(world):
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok-1")
    steps.await_placement(deps, job["job_id"], "tok-2")  # a job already PENDING only gets the new token
    parked = deps.jobs.get(job["job_id"])
    assert parked["status"] == "PENDING" and parked["placement_token"] == "tok-2"
    assert [e["detail"]["to"] for e in deps.jobs.events(job["job_id"]) if e["type"] == "status"] == ["PENDING"]


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"gpus": 4, "cpu": 16, "memory_gb": 64}, {"GPU": "4", "VCPU": "16", "MEMORY": "65536"}),
        (
            {"gpus": 0.25, "cpu": 0.5, "memory_gb": 1.5},
            {"GPU": "1", "VCPU": "1", "MEMORY": "1536"},
        ),  # Batch: whole units
        (None, {"GPU": "1", "VCPU": "1", "MEMORY": "4096"}),  # the spec's defaults
    ],
)
def test_the_run_input_asks_batch_for_what_the_spec_books(world, resources, expected):
    """RunCloud overrides the job definition's resources (1 GPU) with the spec's: a 4-GPU job gets 4."""
    job = world.new_job(resources=resources)
    steps.await_placement(world.deps, job["job_id"], "tok")
    p = world.place(job["job_id"])
    run = steps.prepare_run(world.deps, {"job_id": job["job_id"], "placement": p})
    assert {r["Type"]: r["Value"] for r in run["resource_requirements"]} == expected


@pytest.mark.parametrize(("max_run", "expected"), [(600, 600 + ATTEMPT_MARGIN_SECONDS), (None, 24 * 3600)])
def test_the_run_input_bounds_the_batch_attempt_by_max_run_seconds(world, max_run, expected):
    """RunCloud's SubmitJob Timeout.AttemptDurationSeconds: Batch stops an attempt whose runtime hung past the
    spec's limit (the margin leaves the runtime its own stop); without one, the deployment's run timeout."""
    job = world.new_job(max_run_seconds=max_run)
    steps.await_placement(world.deps, job["job_id"], "tok")
    p = world.place(job["job_id"], target="cloud")
    run = steps.prepare_run(world.deps, {"job_id": job["job_id"], "placement": p})
    assert run["attempt_duration_seconds"] == expected


def test_a_cloud_gang_runs_as_one_multi_node_parallel_job_a_node_per_member(world):
    """RunCloudGang's NodeOverrides: one node per member, each with the member's GPUs, vCPUs and memory and the
    same runtime command (each node learns its rank from Batch); a single-node or on-prem run has none."""
    job = world.new_job(resources={"gpus": 4, "cpu": 8, "memory_gb": 32, "nodes": 3})
    steps.await_placement(world.deps, job["job_id"], "tok")
    p = {**world.place(job["job_id"], target="cloud"), "job_queue": "gpufleet-gpu-gang", "members": [{}, {}, {}]}
    run = steps.prepare_run(world.deps, {"job_id": job["job_id"], "placement": p})
    (node,) = run["node_overrides"]["NodePropertyOverrides"]
    assert run["node_overrides"]["NumNodes"] == 3 and node["TargetNodes"] == "0:"
    assert node["ContainerOverrides"]["Command"] == run["command"]
    assert {r["Type"]: r["Value"] for r in node["ContainerOverrides"]["ResourceRequirements"]} == {
        "GPU": "4", "VCPU": "8", "MEMORY": "32768"}
    single = world.new_job()
    steps.await_placement(world.deps, single["job_id"], "tok")
    p1 = world.place(single["job_id"], target="cloud")
    assert "node_overrides" not in steps.prepare_run(world.deps, {"job_id": single["job_id"], "placement": p1})


def test_lost_worker_fenced_at_classification(world):
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p = world.place(job["job_id"])
    deps.metrics = metrics = RecordingMetrics()
    decision = steps.classify_failure(
        deps, {"job_id": job["job_id"], "placement": p, "error": {"Error": "States.Timeout"}}
    )
    assert decision["action"] == "retry" and decision["epoch"] == p["epoch"] + 1
    assert metrics.values("AttemptFailures", FailureClass="SYSTEM") == [1.0]
    with pytest.raises(StaleEpoch):
        deps.jobs.fenced_update(job["job_id"], p["epoch"], {"progress": {"step": 9}})
    with pytest.raises(StaleEpoch):
        deps.ledger.record(
            job, p["epoch"], Charge(True, 1.0, Decimal("0.001"), None, Outcome.SUCCEEDED), pool="x", price=3.6, at="t"
        )
    after = deps.jobs.get(job["job_id"])
    assert after["system_failures"] == 1 and after["crashed_workers"] == {p["node"]}
    assert world.released == [(job["job_id"], p["epoch"])]
    assert "attempt_failed" in [e["type"] for e in deps.jobs.events(job["job_id"])]


def test_fenced_transition_distinguishes_stale_epoch(world):
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p = world.place(job["job_id"])
    with pytest.raises(StaleEpoch):
        deps.jobs.transition(job["job_id"], [S.SCHEDULED], S.RUNNING, epoch=p["epoch"] - 1)
    assert deps.jobs.transition(job["job_id"], [S.SCHEDULED], S.RUNNING, epoch=p["epoch"])["status"] == "RUNNING"


def test_cancel_propagate_fails_placement_token(world):
    deps, job, tokens = world.deps, world.new_job(), MemoryTaskTokens()
    steps.await_placement(deps, job["job_id"], tokens.wait("tok"))
    requested = deps.jobs.request_cancel(job["job_id"])
    done = cancel.propagate(requested, tokens=tokens)
    assert done["actions"] and done["actions"][0] == "placement_token_failed"
    assert [(s.kind, s.token, s.error) for s in tokens.sent] == [("fail", "tok", "CANCELLED")]
    d = steps.classify_failure(deps, {"job_id": job["job_id"], "error": {"Error": "CANCELLED", "Cause": "{}"}})
    assert d["action"] == "cancelled"
    assert steps.bill(deps, job["job_id"])["charged"] is False
    assert deps.jobs.get(job["job_id"])["status"] == "CANCELLED"
    assert cancel.propagate(deps.jobs.get(job["job_id"]), tokens=tokens)["actions"] == []  # ended: nothing to tell
    assert len(tokens.sent) == 1


def test_a_cancel_that_beat_the_placement_releases_the_attempt_the_workflow_never_saw(world):
    """The scheduler placed the job (SCHEDULED, an attempt, GPUs booked) after the cancel had failed the token:
    the workflow's state has no placement, yet ending the job gives that attempt back."""
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    requested = deps.jobs.request_cancel(job["job_id"])
    assert requested["status"] == "PENDING"
    p = world.place(job["job_id"])  # the pass's commit lands after the cancel read the job
    d = steps.classify_failure(deps, {"job_id": job["job_id"], "error": {"Error": "CANCELLED", "Cause": "{}"}})
    assert d["action"] == "cancelled"
    assert world.released == [(job["job_id"], p["epoch"])]
    assert deps.jobs.get(job["job_id"])["status"] == "CANCELLED"


class RecordingSignals:
    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[str, str, int]] = []
        self.refuse = refuse

    def nudge(self, queue_url: str, job_id: str, epoch: int) -> bool:
        self.sent.append((queue_url, job_id, epoch))
        return queue_url not in self.refuse


@pytest.mark.parametrize("status", ["SCHEDULED", "RUNNING", "FINALIZING"])
def test_cancel_of_an_onprem_job_nudges_every_node_of_its_placement_once(status):
    """A gang's members each get a nudge (the placement's queue once, though a member shares it); a refused
    nudge is an outcome, not an error: the agents' heartbeats still see the cancel."""
    placement = {"target": "onprem", "epoch": 4, "pool": "p", "node": "n1", "queue_url": "https://q/gpufleet-node-n1",
                 "members": [{"node": "n1", "queue_url": "https://q/gpufleet-node-n1", "gpu_indices": [0]},
                             {"node": "n2", "queue_url": "https://q/gpufleet-node-n2", "gpu_indices": [0]}]}
    job = {"job_id": "j1", "status": status, "cancel_requested": True, "current_epoch": 4, "placement": placement}
    signals = RecordingSignals(refuse=frozenset({"https://q/gpufleet-node-n2"}))
    done = cancel.propagate(job, signals=signals)
    assert signals.sent == [("https://q/gpufleet-node-n1", "j1", 4), ("https://q/gpufleet-node-n2", "j1", 4)]
    assert done["actions"] == ["agent_notified_via_job_item", "node_nudged:gpufleet-node-n1", "node_nudge_failed"]
    # a cloud job, a pending one or an ended one nudges nobody
    for other in ({**job, "placement": {**placement, "target": "cloud"}}, {**job, "status": "PENDING"},
                  {**job, "status": "CANCELLED"}):
        cancel.propagate(other, signals=signals)
    assert len(signals.sent) == 2
    # a repeated cancel (the API's nudge=False) still names the job item, and sends no node anything
    again = cancel.propagate(job, signals=signals, nudge=False)
    assert len(signals.sent) == 2 and again["actions"] == ["agent_notified_via_job_item", "node_nudge_skipped:repeat"]


def test_propagate_requires_cancel_flag(world):
    with pytest.raises(ValueError):
        cancel.propagate(world.new_job())


def ran(world) -> tuple:
    """A video job placed and run to CompleteRun: (deps, job, placement, the workflow's state)."""
    deps, job = world.deps, world.new_job()
    steps.await_placement(deps, job["job_id"], "tok")
    p = world.place(job["job_id"])
    state = {"job_id": job["job_id"], "placement": p, "result": {"epoch": p["epoch"], "gpu_seconds": 1.0}}
    state["completed"] = {"value": steps.complete_run(deps, state)}
    return deps, job, p, state


def test_complete_run_gives_the_gpus_back_before_finalize_and_wakes_the_scheduler(world):
    """The run is over at FINALIZING: its booking goes back then (CapacityFreed: a waiting job starts on the GPUs while
    this one is finalized); Publish afterwards releases nothing more and wakes nobody."""
    world.deps.events = bus = MemoryEventBus()
    deps, job, p, state = ran(world)
    assert deps.jobs.get(job["job_id"])["status"] == "FINALIZING"
    assert world.released == [(job["job_id"], p["epoch"])]
    freed = ("CapacityFreed", {"job_id": job["job_id"], "epoch": p["epoch"]})
    assert bus.sent == [("JobPending", {"job_id": job["job_id"]}), freed]
    deps.jobs.fenced_update(job["job_id"], p["epoch"], {"output": {"video_key": "v"}})
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    assert world.released == [(job["job_id"], p["epoch"])]
    assert bus.sent == [("JobPending", {"job_id": job["job_id"]}), freed]


def test_complete_run_gives_the_finalize_route_its_clip_size(world):
    from gpufleet.finalize_route import finalize_pixels
    from gpufleet.spec import JobSpec

    _, job, _, state = ran(world)
    w = JobSpec.model_validate(job["spec"]).workload  # the spec's defaults: 9 frames at 256 × 256
    assert state["completed"]["value"]["finalize_pixels"] == finalize_pixels(w.frames, w.width, w.height) == 9 * 256 * 256


def test_publish_blocked_output_never_exposed(world):
    deps, job, p, state = ran(world)
    deps.jobs.fenced_update(
        job["job_id"], p["epoch"], {"moderation": {"blocked": True, "reason": "nsfw"}, "output": {"video_key": "v"}}
    )
    assert steps.publish(deps, state)["status"] == "BLOCKED"
    assert "output" not in deps.jobs.get(job["job_id"])


def test_publish_indexes_the_video_by_its_watermark_payload(world):
    deps, job, p, state = ran(world)
    out = {
        "video_key": "jobs/x/video.mp4",
        "manifest_key": "jobs/x/video.c2pa",
        "watermark_payload": "a1b2c3d4e5f6",
        "watermark_key_id": "k1",
        "video_sha256": "cd" * 32,
    }
    deps.jobs.fenced_update(job["job_id"], p["epoch"], {"output": out})
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    [entry] = deps.provenance.lookup("a1b2c3d4e5f6")
    assert (entry.job_id, entry.key_id, entry.manifest_key, entry.video_sha256) == (
        job["job_id"],
        "k1",
        "jobs/x/video.c2pa",
        "cd" * 32,
    )


def test_workflow_failure_marks_failed_without_charge(world):
    deps, job = world.deps, world.new_job()
    deps.metrics = metrics = RecordingMetrics()
    state = {"job_id": job["job_id"], "error": {"Error": "Lambda.Unknown", "Cause": "boom"}}
    assert steps.mark_terminal(deps, state, "FAILED", "workflow")["outcome"] == "SYSTEM_FAILURE"
    assert metrics.values("WorkflowFailed") == [1.0] and metrics.values("FinalizeFailed") == []
    after = deps.jobs.get(job["job_id"])
    assert after["status"] == "FAILED" and after["final"]["reason"] == "workflow failed: Lambda.Unknown"
    assert steps.bill(deps, job["job_id"])["charged"] is False
    assert world.released == []


def test_a_cloud_run_without_reported_gpu_seconds_bills_every_gpu_it_booked(world):
    deps, job = world.deps, world.new_job(resources={"gpus": 4})
    steps.await_placement(deps, job["job_id"], "tok")
    p = world.place(job["job_id"], target="cloud")
    state = {
        "job_id": job["job_id"],
        "placement": p,
        "result": {"epoch": p["epoch"], "StartedAt": 1_000, "StoppedAt": 31_000},
    }  # a Batch job: 30 s
    steps.complete_run(deps, state)
    assert deps.jobs.get(job["job_id"])["last_run"]["gpu_seconds"] == pytest.approx(120.0)


GANG = {
    "workload": {"kind": "container", "image": "localhost/t/a:1", "command": ["true"]},
    "resources": {"gpus": 2, "nodes": 2},
}


@pytest.mark.parametrize(
    ("workload", "gpus"), [({"workload": {"kind": "video.generate", "prompt": "a cat"}}, 1), (GANG, 4)]
)  # a gang: every member's GPUs (2 nodes × 2)
def test_an_attempt_stopped_at_max_run_seconds_fails_the_job_timed_out_and_is_charged_up_to_the_limit(
    world, workload, gpus
):
    deps = world.deps
    job = world.new_job(spec={**workload, "max_run_seconds": 60})
    steps.await_placement(deps, job["job_id"], "tok")
    p = world.place(job["job_id"])
    # it ran 500 s by the workflow's clock (the agent's stop grace, a slow report): the charge stops at 60 s
    deps.jobs.fenced_update(job["job_id"], p["epoch"], {"running_since": deps.clock.now() - 500})
    error = {
        "Error": "TIMED_OUT",
        "Cause": json.dumps(
            {"epoch": p["epoch"], "node": p["node"], "detail": "maximum run time of 60 s exceeded; exit 60"}
        ),
    }
    decision = steps.classify_failure(deps, {"job_id": job["job_id"], "placement": p, "error": error})
    assert decision["action"] == "fail"
    after = deps.jobs.get(job["job_id"])
    assert after["status"] == "FAILED" and after["final"]["outcome"] == "TIMED_OUT"
    assert "maximum run time of 60 s exceeded" in after["final"]["reason"]
    assert int(after.get("system_failures", 0)) == 0  # not a system failure: no retry budget used
    billing = steps.bill(deps, job["job_id"])
    assert billing["charged"] is True and float(billing["gpu_seconds"]) == pytest.approx(60.0 * gpus)


def test_a_gang_retried_as_a_unit_is_billed_once_for_the_attempt_that_ran_counting_every_member(world):
    """Issue 14: a 2-node × 2-GPU gang whose member's agent died (SYSTEM, the node API's gang cause) is fenced and
    retried on a new epoch, not charged; the retry's attempt is charged once for both members' GPU-seconds (the
    node API's sum), and a retried Bill writes no second entry. Each attempt's booking is released once."""
    deps = world.deps
    job_id = world.new_job(spec=GANG)["job_id"]
    steps.await_placement(deps, job_id, "tok")
    p1 = world.place(job_id)
    cause = {"epoch": p1["epoch"], "node": "n-b", "detail": "gang member silent for over 90s: n-b", "gang": True}
    decision = steps.classify_failure(
        deps, {"job_id": job_id, "placement": p1, "error": {"Error": "SYSTEM_ERROR", "Cause": json.dumps(cause)}}
    )
    assert decision["action"] == "retry" and decision["epoch"] == p1["epoch"] + 1
    steps.await_placement(deps, job_id, "tok2")
    p2 = world.place(job_id)
    assert p2["epoch"] > p1["epoch"]
    state = {"job_id": job_id, "placement": p2}
    # the node API answered the Run state with both members' GPU-seconds: 2 members × 2 GPUs × 30 s
    state["result"] = {
        "epoch": p2["epoch"],
        "gpu_seconds": 120.0,
        "generated": {"key": f"jobs/{job_id}/output/e{p2['epoch']:04d}/", "files": 1, "bytes": 1},
    }
    state["completed"] = {"value": steps.complete_run(deps, state)}
    deps.jobs.fenced_update(job_id, p2["epoch"], {"output": {"kind": "files", "files": 1}})
    assert steps.publish(deps, state)["status"] == "SUCCEEDED"
    billing = steps.bill(deps, job_id)
    assert billing["ledger_entry_written"] is True and float(billing["gpu_seconds"]) == pytest.approx(120.0)
    assert steps.bill(deps, job_id)["ledger_entry_written"] is False
    (entry,) = deps.ledger.entries(job_id)  # the failed attempt was not charged
    assert int(entry["epoch"]) == p2["epoch"]
    assert sorted(world.released) == [(job_id, p1["epoch"]), (job_id, p2["epoch"])]


def test_prompt_checked_event_records_category_score_and_policy_version(world):
    verdict = {
        "allowed": False,
        "reason": "hate: P(unsafe) 0.9",
        "category": "hate",
        "score": 0.91,
        "policy_version": "2026-12-02.1",
    }
    job = world.new_job("a prompt")
    d = dataclasses.replace(world.deps, prompt_check=lambda text: verdict)
    assert steps.check_prompt(d, {"job_id": job["job_id"]}) == {"allowed": False, "reason": "hate: P(unsafe) 0.9"}
    (checked,) = [e for e in world.deps.jobs.events(job["job_id"]) if e["type"] == "prompt_checked"]
    assert {k: checked["detail"][k] for k in ("allowed", "category", "score", "policy_version")} == {
        "allowed": False,
        "category": "hate",
        "score": 0.91,
        "policy_version": "2026-12-02.1",
    }
    # an allowed prompt is in no category: the filter's nearest one is recorded under its own name
    allowed = {"allowed": True, "reason": None, "category": "animal_cruelty", "score": 0.0001, "policy_version": "v9"}
    job = world.new_job("a red fox running through snow")
    d = dataclasses.replace(world.deps, prompt_check=lambda text: allowed)
    assert steps.check_prompt(d, {"job_id": job["job_id"]}) == {"allowed": True, "reason": None}
    (checked,) = [e for e in world.deps.jobs.events(job["job_id"]) if e["type"] == "prompt_checked"]
    assert "category" not in checked["detail"] and "score" not in checked["detail"]
    assert (checked["detail"]["nearest_category"], checked["detail"]["nearest_score"]) == ("animal_cruelty", 0.0001)
