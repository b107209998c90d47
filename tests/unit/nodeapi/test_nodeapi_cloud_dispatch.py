"""A cloud container run's dispatch (gpufleet.nodeapi.cloud_dispatch) on the in-memory stores: the per-image
definition, the task token and the supervisor token's hash on the attempt (fenced), then SubmitJob — and what
never leaves it (the token and the env are in the SubmitJob request only, not in its answer)."""

from __future__ import annotations

import json

import pytest

from gpufleet.batchdef import SUPERVISOR_TOKEN_ENV
from gpufleet.clock import FakeClock
from gpufleet.errors import NotAllowed, StaleEpoch
from gpufleet.nodeapi import supervisor
from gpufleet.nodeapi.cloud_dispatch import CloudDispatchSettings, dispatch_cloud
from gpufleet.store.fakes.jobdefs import MemoryJobDefinitions
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.fakes.runs import MemoryRunStore
from gpufleet.store.runs import SUPERVISOR_TOKEN_ATTR
from gpufleet.tables import JOB_META, attempt_sk, job_pk

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/t1/train@sha256:" + "b" * 64
SETTINGS = CloudDispatchSettings(
    prefix="gf",
    supervisor_image="rt@sha256:" + "c" * 64,
    execution_role_arn="arn:aws:iam::123456789012:role/gf-tenant-exec",
    log_group="gf-jobs",
    region="us-east-1",
    node_api_url="https://node.example/prod",
    run_timeout_seconds=3600,
)
PLACEMENT = {"epoch": 2, "attempt": 2, "target": "cloud", "pool": "cloud-spot", "job_queue": "gf-gpu-spot"}


def world(image: str = IMAGE, epoch: int = 2):
    db, clock = MemoryDatabase(), FakeClock()
    runs = MemoryRunStore(db, clock)
    spec = {
        "workload": {
            "kind": "container",
            "image": image,
            "command": ["python", "train.py"],
            "env": {"SECRET_LR": "0.125"},
        },
        "data": {"inputs": ["s3://gf-out/tenants/t1/in.bin"]},
    }
    db.put("jobs", {"pk": job_pk("j1"), "sk": JOB_META, "job_id": "j1", "current_epoch": epoch, "spec": spec})
    db.put("jobs", {"pk": job_pk("j1"), "sk": attempt_sk(2), "placement": PLACEMENT})
    return db, runs, clock


def event(queue: str = "gf-gpu-spot") -> dict:
    envelope = {
        "job_id": "j1",
        "attempt": 2,
        "epoch": 2,
        "stage": "container",
        "s3": {
            "bucket_outputs": "o",
            "bucket_checkpoints": "c",
            "bucket_logs": "l",
            "output_prefix": "jobs/j1/",
            "checkpoint_prefix": "jobs/j1/",
            "log_prefix": "jobs/j1/attempt-0002/",
        },
    }
    return {
        "job_id": "j1",
        "token": "sfn-task-token",
        "run": {
            "envelope": envelope,
            "job_queue": queue,
            "batch_job_name": "j1-e2",
            "command": ["python", "-m", "gpufleet.runtime", "--envelope-json", json.dumps(envelope)],
            "attempt_duration_seconds": 900,
        },
        "batch": {"job_queue": "arn:aws:batch:us-east-1:123456789012:job-queue/gf-gpu-spot"},
    }


def test_dispatch_registers_records_then_submits_with_the_token_to_the_supervisor_only():
    db, runs, clock = world()
    defs, submitted = MemoryJobDefinitions(), []
    got = dispatch_cloud(runs, defs, lambda **kw: submitted.append(kw) or {"jobId": "b-1"}, clock, SETTINGS, event())
    (req,) = submitted
    assert req["jobDefinition"] == got["job_definition"] and ":job-definition/gf-tenant-" in req["jobDefinition"]
    assert req["jobQueue"].endswith("/gf-gpu-spot") and req["timeout"] == {"attemptDurationSeconds": 900}
    containers = {c["name"]: c for c in req["ecsPropertiesOverride"]["taskProperties"][0]["containers"]}
    sup_env = {e["name"]: e["value"] for e in containers["supervisor"]["environment"]}
    tenant_env = {e["name"]: e["value"] for e in containers["tenant"]["environment"]}
    token = sup_env[SUPERVISOR_TOKEN_ENV]
    assert sup_env["GPUFLEET_NODE_API_URL"] == "https://node.example/prod"
    assert containers["supervisor"]["command"][:4] == ["python", "-m", "gpufleet.runtime", "--envelope-json"]
    sup_envelope = json.loads(containers["supervisor"]["command"][4])
    assert sup_envelope["spec"]["data"]["inputs"] == ["s3://gf-out/tenants/t1/in.bin"]  # what it stages
    assert sup_envelope["spec"]["workload"]["env"] == {} and "0.125" not in containers["supervisor"]["command"][4]
    assert containers["tenant"]["command"] == ["python", "train.py"] and tenant_env["SECRET_LR"] == "0.125"
    assert SUPERVISOR_TOKEN_ENV not in tenant_env and not [n for n in tenant_env if n.startswith("AWS_")]
    attempt = runs.attempt("j1", 2)
    assert attempt["run_token"] == "sfn-task-token"  # the node API answers it when the supervisor reports
    assert attempt[SUPERVISOR_TOKEN_ATTR] == supervisor.token_sha256(token) and token not in json.dumps(attempt)
    assert attempt["inputs"] == ["s3://gf-out/tenants/t1/in.bin"]
    answer = json.dumps(got)  # what the state keeps
    assert token not in answer and "0.125" not in answer and got["batch_job_id"] == "b-1"
    again = dispatch_cloud(runs, defs, lambda **kw: {"jobId": "b-2"}, clock, SETTINGS, event())
    assert again["job_definition"] == got["job_definition"]  # the image's definition is registered once


@pytest.mark.parametrize("case", ["other-queue", "tag-only", "stale"])
def test_a_refused_dispatch_submits_nothing(case):
    db, runs, clock = world(
        image="registry.example/t1/train:latest" if case == "tag-only" else IMAGE, epoch=3 if case == "stale" else 2
    )
    submitted = []
    with pytest.raises(StaleEpoch if case == "stale" else NotAllowed):
        dispatch_cloud(
            runs,
            MemoryJobDefinitions(),
            lambda **kw: submitted.append(kw),
            clock,
            SETTINGS,
            event("gf-gpu-ondemand" if case == "other-queue" else "gf-gpu-spot"),
        )
    assert submitted == [] and SUPERVISOR_TOKEN_ATTR not in (runs.attempt("j1", 2) or {})


def test_the_dispatch_functions_settings_come_from_the_stacks_variables():
    from gpufleet.errors import ConfigError
    from gpufleet.nodeapi.settings import CloudDispatchEnv

    env = {"GPUFLEET_JOBS_TABLE": "jobs-t", "GPUFLEET_PREFIX": "gf", "GPUFLEET_SUPERVISOR_IMAGE": "rt@sha256:" + "e" * 64,
           "GPUFLEET_TENANT_EXECUTION_ROLE_ARN": "arn:aws:iam::1:role/exec", "GPUFLEET_TENANT_LOG_GROUP": "lg",
           "GPUFLEET_REGION": "eu-west-1", "GPUFLEET_NODE_API_URL": "https://api.example/v1",
           "GPUFLEET_RUN_TIMEOUT_SECONDS": "600"}
    loaded = CloudDispatchEnv.load(env=env)
    assert loaded.jobs_table == "jobs-t"
    assert loaded.dispatch() == CloudDispatchSettings(
        prefix="gf", supervisor_image="rt@sha256:" + "e" * 64, execution_role_arn="arn:aws:iam::1:role/exec",
        log_group="lg", region="eu-west-1", node_api_url="https://api.example/v1", run_timeout_seconds=600)
    for missing in ("GPUFLEET_SUPERVISOR_IMAGE", "GPUFLEET_TENANT_EXECUTION_ROLE_ARN", "GPUFLEET_NODE_API_URL"):
        with pytest.raises(ConfigError, match=missing.removeprefix("GPUFLEET_").lower()):
            CloudDispatchEnv.load(env={k: v for k, v in env.items() if k != missing})
