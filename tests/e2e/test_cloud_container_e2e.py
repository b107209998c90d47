"""Cloud container jobs through the real stack (issue 13): the tenant's image runs beside the platform's supervisor.

A container job placed on a cloud pool goes through the deployed workflow's ``RunCloudContainer``: the
``dispatch_cloud`` function registers the image's per-digest Batch definition and submits the multi-container job
(never through the state), the local Batch runner runs its ECS task (:mod:`gpufleet.local.ecs_task`: the supervisor
as a process — the real runtime, which exchanges its one-time token at the node API through the stack's gateway —
and the tenant's image, by digest, under rootless podman once the supervisor's ready file exists). The supervisor
answers the Run state through the node API. Checked: the job reaches SUCCEEDED through CollectOutputs, its files
are listed by ``/output``, it is billed once, and the tenant saw no AWS variable and no token (its probe files);
a tenant that exits non-zero makes the job FAILED as the user's failure (USER, not retried); cancelling a running
one stops its command within 5 s (TerminateJob stops the supervisor, whose exit stops the task) and the job ends
CANCELLED. Runs on the session's stack (tests/e2e/conftest.py) with the lifecycle suite; about 30 s of its own
once the stack is up.
"""

from __future__ import annotations

import time

import psutil
import pytest
from stack_helpers import wait_for

from gpufleet.sdk import Client

pytestmark = [pytest.mark.xdist_group("e2e-stack"), pytest.mark.slow]

JOB_TIMEOUT_S = 150
PROBE = (
    'out="$GPUFLEET_OUTPUT_DIR"; echo "hello from $GPUFLEET_JOB_ID" > "$out/hello.txt"; '
    'env > "$out/env.txt"; id -u > "$out/uid.txt"; '
    '(touch /probe-root 2>/dev/null && echo writable || echo read-only) > "$out/root.txt"'
)


def _unavailable() -> str | None:
    from gpufleet.local import oci_image

    return oci_image.local_oci_unavailable()


@pytest.fixture(scope="module")
def image():
    reason = _unavailable()
    if reason:
        pytest.skip(f"tenant containers unavailable: {reason}")
    from gpufleet.local import oci_image

    return oci_image.pinned_ref(oci_image.prepare_local().podman)  # cloud pools run images by digest


def _submit(client: Client, image: str, script: str) -> str:
    spec = {"workload": {"kind": "container", "image": image, "command": ["sh", "-c", script],
                         "env": {"TENANT_SETTING": "tenant-value-e2e"}},
            "pools": ["cloud-ondemand"]}
    return client.submit(spec).job_id


def _ended(world, job_id: str) -> dict:
    sfn = world.c("stepfunctions")

    def done():
        try:
            d = sfn.describe_execution(executionArn=world.execution_arn(job_id))
        except sfn.exceptions.ExecutionDoesNotExist:
            return None
        return d if d["status"] != "RUNNING" else None

    try:
        return wait_for(done, JOB_TIMEOUT_S, 0.25, f"the execution of {job_id}")
    except AssertionError as err:
        raise AssertionError(f"{err}\njob: {world.job(job_id)}\n{world.describe_history(job_id)}") from None


def _states(world, job_id: str) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in world.history(job_id) if "stateEnteredEventDetails" in e]


MARKER = "gpufleet-e2e-cloud-cancel"


def _marked() -> list[int]:
    """Processes whose command line carries :data:`MARKER` (the tenant's command in its container)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info.get("cmdline") or [])
        if MARKER in line and "pytest" not in line and "gpufleet.runtime" not in line and "podman" not in line:
            found.append(proc.pid)
    return found


@pytest.fixture(scope="module")
def jobs(devstack, image):
    """Three jobs at once: one that writes its files and probes, one whose command fails, one cancelled while its
    command runs."""
    world, client = devstack["world"], Client()
    ok = _submit(client, image, PROBE)
    failing = _submit(client, image, 'echo "about to fail" >&2; exit 3')
    cancelled = _submit(client, image, f"sleep 300; : {MARKER}")
    wait_for(_marked, 120, 0.1, "the cancelled job's command")
    t0 = time.monotonic()
    client.cancel(cancelled)
    wait_for(lambda: not _marked(), 30, 0.05, "the command to stop")
    stopped_s = time.monotonic() - t0
    return {"world": world, "client": client, "ok": ok, "ok_end": _ended(world, ok), "failing": failing,
            "failing_end": _ended(world, failing), "cancelled": cancelled, "cancelled_end": _ended(world, cancelled),
            "stopped_s": stopped_s}


def test_a_cloud_container_job_runs_its_image_beside_the_supervisor_and_succeeds(jobs, tmp_path):
    world, client, job_id = jobs["world"], jobs["client"], jobs["ok"]
    job = world.job(job_id)
    assert jobs["ok_end"]["status"] == "SUCCEEDED" and job["status"] == "SUCCEEDED", world.describe_history(job_id)
    states = _states(world, job_id)
    assert "RunCloudContainer" in states and "RunCloud" not in states and "FinalizeStage" not in states
    assert "CollectOutputs" in states
    (attempt,) = world.attempts(job_id)
    assert attempt["placement"]["pool"] == "cloud-ondemand" and not attempt["placement"].get("node")
    assert attempt.get("supervisor_token_claimed_at")  # the supervisor exchanged its one-time token
    # one Batch job: the per-image multi-container definition (no RunCloud, no finalize). The supervisor answers the
    # Run state before its process (and so the task) has ended: the Batch job reaches its end a moment after the job
    (batch_job,) = wait_for(lambda: [j for j in world.batch_jobs(job_id) if j["status"] in ("SUCCEEDED", "FAILED")]
                            or None, 30, 0.2, "the Batch job to end")
    assert batch_job["status"] == "SUCCEEDED" and len(world.batch_jobs(job_id)) == 1
    described = world.c("batch").describe_jobs(jobs=[batch_job["jobId"]])["jobs"][0]
    assert described["jobDefinition"].split("/")[-1].startswith("gpufleet-tenant-")
    # its files, listed by /output and downloaded
    out = client.output(job_id)
    assert out.kind == "files" and sorted(f.path for f in out.files) == ["env.txt", "hello.txt", "root.txt", "uid.txt"]
    got = client.download_output(job_id, tmp_path, out)
    assert got["hello.txt"].read_text() == f"hello from {job_id}\n"
    # the tenant: the spec's env and the contract, no AWS variable, no token; uid 65534, a read-only root
    env = dict(line.split("=", 1) for line in got["env.txt"].read_text().splitlines() if "=" in line)
    assert env["TENANT_SETTING"] == "tenant-value-e2e" and env["GPUFLEET_JOB_ID"] == job_id
    assert not [k for k in env if k.startswith("AWS_") or "TOKEN" in k or k == "GPUFLEET_NODE_API_URL"], env
    assert got["uid.txt"].read_text().strip() == "65534" and got["root.txt"].read_text().strip() == "read-only"
    # billed once, for the attempt that ran
    (entry,) = world.ledger(job_id)
    assert int(entry["epoch"]) == int(job["current_epoch"]) and float(entry["amount_usd"]) > 0
    assert job["billing"]["charged"] is True
    # neither the supervisor's token nor the tenant's env value is in the execution history
    history = str(world.history(job_id))
    assert "tenant-value-e2e" not in history and "GPUFLEET_SUPERVISOR_TOKEN" not in history


def test_a_failing_cloud_container_job_is_the_users_failure(jobs):
    world, job_id = jobs["world"], jobs["failing"]
    job = world.job(job_id)
    assert jobs["failing_end"]["status"] == "FAILED" and job["status"] == "FAILED", world.describe_history(job_id)
    assert job["last_failure"]["class"] == "USER", job["last_failure"]
    assert len(world.attempts(job_id)) == 1  # the user's failure is not retried
    states = _states(world, job_id)
    assert "RunCloudContainer" in states and "ClassifyFailure" in states and "CollectOutputs" not in states


def test_cancelling_a_running_cloud_container_job_stops_its_command_within_5s(jobs):
    world, job_id = jobs["world"], jobs["cancelled"]
    print(f"\n[e2e] cloud container job {job_id}: command stopped {jobs['stopped_s']:.2f}s after the cancel request")
    assert jobs["stopped_s"] < 5.0
    job = world.job(job_id)
    assert job["status"] == "CANCELLED" and jobs["cancelled_end"]["status"] == "SUCCEEDED"  # the workflow did its job
    assert "RunCloudContainer" in _states(world, job_id)
    wait_for(lambda: all(j["status"] in ("SUCCEEDED", "FAILED") for j in world.batch_jobs(job_id)), 30,
             what="the Batch job to end")
    assert job["billing"]["outcome"] == "CANCELLED_RUNNING"
