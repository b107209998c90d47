"""Lifecycle end-to-end: executions of the deployed state machine on moto, acceptance (a)-(i) of issue 3.

Scenarios run one after another on one deployed stack and fleet (module fixture ``lifecycle``):
running them concurrently in one process trips thread-safety limits of in-process moto.
"""

from __future__ import annotations

import json
import time

import pytest
from lifecycle_fleet import Plan
from lifecycle_stack import wait_for

from gpufleet.lifecycle import cancel, ledger
from gpufleet.store import jobs
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.tables import attempt_sk, job_pk
from gpufleet.webhooks import delivery, signing

pytestmark = pytest.mark.xdist_group("lifecycle-e2e")


def submit(env, plan: Plan, prompt: str = "a red fox running through snow", webhook: bool = True,
           user: str = "ana") -> str:
    stack, fleet = env["stack"], env["fleet"]
    spec = {"workload": {"kind": "video.generate", "prompt": prompt}, "resources": {"gpus": 1}}
    if webhook:
        spec["webhook"] = {"url": env["receiver"].url, "events": ["completed"]}
    job = jobs.create_job(stack.c("dynamodb"), env["tables"], tenant="acme", team="vision", user=user, spec=spec)
    fleet.plans[job["job_id"]] = plan
    # the outbox's role: execution name = job id
    stack.c("stepfunctions").start_execution(
        stateMachineArn=stack.state_machine_arn, name=job["job_id"], input=json.dumps({"job_id": job["job_id"]})
    )
    return job["job_id"]


def finish(env, job_id: str, expect: str, timeout: float = 60) -> dict:
    """Wait for the execution to end; the job must be ``expect`` (the history is shown otherwise)."""
    sfn = env["stack"].c("stepfunctions")
    arn = env["stack"].state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"

    def done():
        d = sfn.describe_execution(executionArn=arn)
        return d if d["status"] != "RUNNING" else None

    try:
        desc = wait_for(done, timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{_history(sfn, arn)}") from None
    assert desc["status"] == "SUCCEEDED", _history(sfn, arn)
    job = jobs.get_job(env["stack"].c("dynamodb"), env["tables"].jobs, job_id)
    assert job["status"] == expect, _history(sfn, arn)
    return job


def _history(sfn, arn) -> str:
    events = sfn.get_execution_history(executionArn=arn)["events"]
    return "\n".join(f"{e['type']} {json.dumps({k: v for k, v in e.items() if k.endswith('Details')}, default=str)[:400]}"
                     for e in events if e["type"].endswith(("Entered", "Failed", "TimedOut", "Succeeded")))


def attempt(env, job_id: str, epoch: int) -> dict:
    """The scheduler's attempt item (written by the real commit; ``released_at`` by the real release)."""
    got = env["stack"].c("dynamodb").get_item(TableName=env["tables"].jobs,
                                              Key=marshal({"pk": job_pk(job_id), "sk": attempt_sk(epoch)}))
    return unmarshal(got.get("Item"))


def control_item(env, pk: str, sk: str) -> dict | None:
    got = env["stack"].c("dynamodb").get_item(TableName=env["tables"].control, Key=marshal({"pk": pk, "sk": sk}))
    return unmarshal(got.get("Item"))


def assert_released(env, job_id: str, placement: dict) -> None:
    """The attempt's capacity is given back: released_at set, allocation record gone, GPU booking 0."""
    epoch, where = int(placement["epoch"]), placement["node"] or placement["pool"]
    assert attempt(env, job_id, epoch)["released_at"]
    assert control_item(env, f"ALLOC#{where}", f"{job_id}#{epoch:08d}") is None
    if placement["node"]:
        assert int(control_item(env, f"ALLOC#{where}", "BOOK")["g0"]) == 0


def entries(env, job_id):
    return ledger.entries(env["stack"].c("dynamodb"), env["tables"].ledger, job_id)


def assert_signed_webhook(env, job_id: str, status: str) -> None:
    ddb = env["stack"].c("dynamodb")
    got = wait_for(lambda: env["receiver"].for_job(job_id), 10)
    secret = delivery.tenant_secret(ddb, env["tables"].control, "acme", create=False)
    signing.verify(secret, got[0]["headers"], got[0]["body"], now=time.time())
    body = json.loads(got[0]["body"])
    assert body["type"] == "job.completed" and body["data"]["status"] == status
    log = jobs.list_deliveries(ddb, env["tables"].jobs, job_id)
    assert log and log[0]["delivered"] is True and log[0]["status_code"] == 204


#: blocked by the real gpufleet.safety.PromptFilter (category graphic_violence)
BLOCKED_PROMPT = "a man stabbing a crowd with a knife, blood everywhere"

SCENARIOS = {
    "a": (lambda: Plan(targets=[("onprem", "node-1")]), {}),
    "b": (lambda: Plan(targets=[("cloud", "cloud-ondemand")]), {}),
    "c": (lambda: Plan(targets=[("onprem", "node-1")]), {"prompt": BLOCKED_PROMPT}),
    "d": (lambda: Plan(targets=[("onprem", "node-2"), ("onprem", "node-3")], behaviours=["silent", "ok"]), {}),
    "e": (lambda: Plan(targets=[("cloud", "cloud-spot"), ("cloud", "cloud-spot")], behaviours=["preempt", "ok"]), {}),
    "f": (lambda: Plan(targets=[("onprem", "node-1")], finalize=["fail", "ok"]), {}),
    "g": (lambda: Plan(targets=[("onprem", "node-1"), ("onprem", "node-2"), ("onprem", "node-3")],
                       behaviours=["crash", "crash", "crash"]), {}),
    "h": (lambda: Plan(targets=[("onprem", "node-2")], behaviours=["until_cancel"]), {"user": "hana"}),
    "i": (lambda: Plan(targets=[("onprem", "node-3")], blocked=True), {}),
    "h_cloud": (lambda: Plan(targets=[("cloud", "cloud-spot")], behaviours=["until_cancel"]), {}),
}


def start(env, name: str) -> tuple[str, Plan]:
    """Submit scenario ``name``: (job_id, plan)."""
    make_plan, kwargs = SCENARIOS[name]
    plan = make_plan()
    return submit(env, plan, **kwargs), plan


def test_lifecycle_a_onprem_happy_path(lifecycle):
    job_id, plan = start(lifecycle, "a")
    job = finish(lifecycle, job_id, "SUCCEEDED")
    assert job["status"] == "SUCCEEDED"
    assert job["output"]["video_key"].endswith("video.mp4")
    (entry,) = entries(lifecycle, job_id)
    assert entry["epoch"] == plan.placements[0]["epoch"] and float(entry["amount_usd"]) > 0
    assert job["billing"]["charged"] is True
    assert_signed_webhook(lifecycle, job_id, "SUCCEEDED")
    assert plan.placements[0]["node"] == "node-1" and plan.placements[0]["pool"] == "onprem-a"
    assert attempt(lifecycle, job_id, plan.placements[0]["epoch"])["state"]
    assert_released(lifecycle, job_id, plan.placements[0])
    s3, bucket = lifecycle["stack"].c("s3"), lifecycle["stack"].buckets["checkpoints"]
    (ckpt,) = s3.list_objects_v2(Bucket=bucket, Prefix=f"jobs/{job_id}/")["Contents"]
    assert {"Key": "gpufleet:job-ended", "Value": "true"} in s3.get_object_tagging(Bucket=bucket, Key=ckpt["Key"])["TagSet"]


def test_lifecycle_b_cloud_happy_path(lifecycle):
    job_id, plan = start(lifecycle, "b")
    job = finish(lifecycle, job_id, "SUCCEEDED")
    assert job["status"] == "SUCCEEDED" and job["output"]["manifest_key"].endswith("manifest.c2pa")
    assert len(entries(lifecycle, job_id)) == 1
    assert job["last_run"]["gpu_seconds"] >= 0
    assert_signed_webhook(lifecycle, job_id, "SUCCEEDED")


def test_lifecycle_c_blocked_prompt_rejected(lifecycle):
    job_id, plan = start(lifecycle, "c")
    job = finish(lifecycle, job_id, "REJECTED")
    assert job["status"] == "REJECTED"
    assert plan.placements == [] and plan.inference_runs == 0 and int(job["current_epoch"]) == 0
    assert entries(lifecycle, job_id) == []
    assert job["billing"]["charged"] is False and "rejected" in job["billing"]["waiver"]
    ddb, table = lifecycle["stack"].c("dynamodb"), lifecycle["tables"].jobs
    (checked,) = [e for e in jobs.list_events(ddb, table, job_id) if e["type"] == "prompt_checked"]
    assert checked["detail"]["allowed"] is False and checked["detail"]["reason"].startswith("graphic_violence")


def test_lifecycle_d_lost_worker_is_fenced(lifecycle):
    job_id, plan = start(lifecycle, "d")
    job = finish(lifecycle, job_id, "SUCCEEDED")
    assert job["status"] == "SUCCEEDED"
    first, second = plan.placements
    assert second["epoch"] > first["epoch"] and (first["node"], second["node"]) == ("node-2", "node-3")
    assert_released(lifecycle, job_id, first)
    wait_for(lambda: len(plan.late_writes) == 3, 10)
    assert plan.late_writes == {"progress": "StaleEpoch", "publish": "StaleEpoch", "billing": "StaleEpoch"}
    (entry,) = entries(lifecycle, job_id)
    assert entry["epoch"] == second["epoch"]
    assert int(job["system_failures"]) == 1


def test_lifecycle_e_preemption_resumes_without_budget(lifecycle):
    job_id, plan = start(lifecycle, "e")
    job = finish(lifecycle, job_id, "SUCCEEDED")
    assert job["status"] == "SUCCEEDED"
    assert int(job["preemptions"]) == 1 and int(job["system_failures"]) == 0
    assert plan.resumed_from == [0, 2]
    assert len(entries(lifecycle, job_id)) == 1


def test_lifecycle_f_finalize_retried_alone(lifecycle):
    job_id, plan = start(lifecycle, "f")
    finish(lifecycle, job_id, "SUCCEEDED")
    assert plan.finalize_runs == 2 and plan.inference_runs == 1 and len(plan.placements) == 1


def test_lifecycle_g_poison_job_quarantined(lifecycle):
    job_id, plan = start(lifecycle, "g")
    job = finish(lifecycle, job_id, "QUARANTINED")
    assert job["status"] == "QUARANTINED"
    assert set(job["crashed_workers"]) == {"node-1", "node-2", "node-3"}
    assert entries(lifecycle, job_id) == [] and job["billing"]["charged"] is False
    # the workers keep serving other jobs
    other = submit(lifecycle, Plan(targets=[("onprem", "node-1")]), webhook=False)
    assert finish(lifecycle, other, "SUCCEEDED")["status"] == "SUCCEEDED"


def test_lifecycle_h_cancel_while_running(lifecycle):
    job_id, plan = start(lifecycle, "h")
    ddb = lifecycle["stack"].c("dynamodb")
    table = lifecycle["tables"].jobs
    wait_for(lambda: jobs.get_job(ddb, table, job_id)["status"] == "RUNNING", 20)
    (placement,) = plan.placements
    quota = "QUOTA#acme/vision/hana"
    assert int(control_item(lifecycle, quota, "QUOTA")["used_all"]) == 1000  # booked by the real commit
    assert int(control_item(lifecycle, "ALLOC#node-2", "BOOK")["g0"]) == 1000
    requested = jobs.request_cancel(ddb, table, job_id, "acme")
    done = cancel.propagate(requested, sfn=lifecycle["stack"].c("stepfunctions"),
                            batch=lifecycle["stack"].c("batch"))
    assert "agent_notified_via_job_item" in done["actions"]
    job = finish(lifecycle, job_id, "CANCELLED")
    assert job["status"] == "CANCELLED" and plan.told_cancel
    assert_released(lifecycle, job_id, placement)
    assert int(control_item(lifecycle, quota, "QUOTA")["used_all"]) == 0
    assert job["billing"]["outcome"] == "CANCELLED_RUNNING"


def test_lifecycle_h_cancel_cloud_job_terminates_batch(lifecycle):
    job_id, plan = start(lifecycle, "h_cloud")
    ddb = lifecycle["stack"].c("dynamodb")
    table = lifecycle["tables"].jobs
    wait_for(lambda: jobs.get_job(ddb, table, job_id)["status"] == "RUNNING", 20)
    requested = jobs.request_cancel(ddb, table, job_id, "acme")
    done = cancel.propagate(requested, sfn=lifecycle["stack"].c("stepfunctions"),
                            batch=lifecycle["stack"].c("batch"))
    assert any(a.startswith("batch_terminated:") for a in done["actions"]), done
    job = finish(lifecycle, job_id, "CANCELLED")
    assert plan.placements[0]["pool"] == "cloud-spot"
    assert_released(lifecycle, job_id, plan.placements[0])
    assert job["final"]["outcome"] == "CANCELLED_RUNNING"


def test_lifecycle_i_blocked_output_never_delivered(lifecycle):
    job_id, plan = start(lifecycle, "i")
    job = finish(lifecycle, job_id, "BLOCKED")
    assert job["status"] == "BLOCKED"
    assert "output" not in job
    outputs = lifecycle["stack"].buckets["outputs"]
    listed = lifecycle["stack"].c("s3").list_objects_v2(Bucket=outputs, Prefix=f"jobs/{job_id}/video")
    assert listed.get("KeyCount", 0) == 0
    body = json.loads(wait_for(lambda: lifecycle["receiver"].for_job(job_id), 10)[0]["body"])
    assert body["data"]["status"] == "BLOCKED" and "output" not in body["data"]
