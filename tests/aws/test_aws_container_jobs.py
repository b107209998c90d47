"""The deployment check of cloud container jobs (issue 13): run after ``cdk deploy`` against a real AWS stack.

Opt-in: skipped at once (nothing is started, nothing is contacted) unless ``GPUFLEET_AWS_CHECK=1``. It reads the
deployment as the SDK does (``GPUFLEET_PROFILE`` / ``GPUFLEET_ENDPOINT``, the profile's credentials or botocore's
chain) and goes only through the public API, plus read-only AWS describe calls made with the operator's own
credentials (boto3's usual chain and ``AWS_ENDPOINT_URL``): ``batch:ListJobs``, ``DescribeJobs``,
``DescribeJobDefinitions``, ``DescribeJobQueues``, ``DescribeComputeEnvironments`` and
``ec2:DescribeLaunchTemplateVersions``. Nothing here reads a table, a bucket or a process of the stack.

Settings (environment):

- ``GPUFLEET_AWS_CHECK_IMAGE`` (required): the tenant image by digest (``repo@sha256:...``) in a registry the
  site's allowlist admits, e.g. ``public.ecr.aws/docker/library/busybox@sha256:...`` mirrored into the account's
  ECR. It needs ``sh`` and one HTTP client for the metadata probe: ``python3``, ``curl`` or ``nc`` (busybox has it).
- ``GPUFLEET_AWS_CHECK_POOL``: the cloud pool to run on (default: the first ``ondemand`` pool, else ``spot``).
- ``GPUFLEET_AWS_CHECK_TIMEOUT_S`` (1800): how long a job may take to end (Batch finds capacity, starts an
  instance, pulls both images).
- ``GPUFLEET_AWS_CHECK_CANCEL_BOUND_S`` (30): a cancelled running job must be CANCELLED within this.
- ``GPUFLEET_AWS_CHECK_DESCRIBE`` (1): ``0`` skips the AWS describe checks (an operator without those rights).

Checked: a cloud container job succeeds; its files are listed by ``/output`` and downloaded; its probe (written by
its own command) shows no AWS credential variable and no token in its environment, uid 65534, a read-only root, and
instance metadata out of reach (the IMDSv2 token PUT gets no answer within 2 s; the metadata GET gets none, or
401); a job exiting 3 ends FAILED as USER without a retry; a cancelled running job ends CANCELLED within the bound
(figures printed with ``-s``); Batch ran the job under the per-image definition whose task has no role and whose
tenant container runs the image as 65534 with a read-only root and no AWS variable; the queue's compute
environments launch from a template that requires IMDSv2 with a PUT hop limit of 1.

On AWS, Batch and ECS add ``AWS_BATCH_*`` and ``AWS_EXECUTION_ENV`` (job metadata, no credential) to every
container; those are the only ``AWS_*`` names allowed (:data:`ECS_METADATA_VARS`). The local stack
(docs/operations.md, "Checking a deployment") runs the same module; what each proves is written there.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("GPUFLEET_AWS_CHECK") != "1":
    pytest.skip("the AWS deployment check runs only with GPUFLEET_AWS_CHECK=1 (docs/operations.md)",
                allow_module_level=True)

from gpufleet.sdk import Client  # noqa: E402

pytestmark = pytest.mark.slow

IMAGE = os.environ.get("GPUFLEET_AWS_CHECK_IMAGE", "")
TIMEOUT_S = float(os.environ.get("GPUFLEET_AWS_CHECK_TIMEOUT_S", "1800"))
CANCEL_BOUND_S = float(os.environ.get("GPUFLEET_AWS_CHECK_CANCEL_BOUND_S", "30"))
DESCRIBE = os.environ.get("GPUFLEET_AWS_CHECK_DESCRIBE", "1") != "0"
#: after the cancelled job is RUNNING (its supervisor is about to start the tenant), before the cancel
SETTLE_S = 5.0
TENANT_VALUE = "tenant-value-aws-check"
#: variables ECS/Batch put in every container of a Batch job: job metadata, never a credential
ECS_METADATA_VARS = re.compile(r"^(AWS_BATCH_[A-Z0-9_]+|AWS_EXECUTION_ENV)$")
#: what an AWS access key id looks like (long-term AKIA, temporary ASIA)
KEY_ID = re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b")

#: the IMDS probe: the IMDSv2 token PUT and an unauthenticated metadata GET, 2 s each, with the first client the
#: image has; one line per request: ``put|get: http <status>`` or ``put|get: unreachable (<why>)``
IMDS_PY = r"""
import socket
def req(method, path, extra):
    try:
        s = socket.create_connection(("169.254.169.254", 80), timeout=2)
        s.settimeout(2)
        s.sendall(("%s %s HTTP/1.0\r\nHost: 169.254.169.254\r\n%s\r\n" % (method, path, extra)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
    except OSError as e:
        return "unreachable (python3: %s: %s)" % (type(e).__name__, e), b""
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ")
    return "http %s" % (parts[1].decode() if len(parts) > 1 else "?"), body
o, b = req("PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 60\r\n")
open("token.txt", "wb").write(b)
print("put:", o)
o, b = req("GET", "/latest/meta-data/", "")
print("get:", o)
"""
PROBE = (
    'out="$GPUFLEET_OUTPUT_DIR"; cd "$out"; : > token.txt; echo "hello from $GPUFLEET_JOB_ID" > hello.txt; '
    'env > env.txt; id -u > uid.txt; '
    '(touch /probe-root 2>/dev/null && echo writable || echo read-only) > root.txt; '
    "if command -v python3 >/dev/null 2>&1; then python3 - > imds.txt <<'EOF'\n" + IMDS_PY.strip() + "\nEOF\n"
    'elif command -v curl >/dev/null 2>&1; then '
    '  c=$(curl -s -m 2 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" -o token.txt -w "%{http_code}" '
    '    http://169.254.169.254/latest/api/token); r=$?; '
    '  if [ $r -eq 0 ]; then echo "put: http $c"; else echo "put: unreachable (curl rc $r)"; fi > imds.txt; '
    '  c=$(curl -s -m 2 -o /dev/null -w "%{http_code}" http://169.254.169.254/latest/meta-data/); r=$?; '
    '  if [ $r -eq 0 ]; then echo "get: http $c"; else echo "get: unreachable (curl rc $r)"; fi >> imds.txt; '
    'elif command -v nc >/dev/null 2>&1; then '
    '  printf "PUT /latest/api/token HTTP/1.0\\r\\nHost: 169.254.169.254\\r\\n'
    'X-aws-ec2-metadata-token-ttl-seconds: 60\\r\\n\\r\\n" | nc -w 2 169.254.169.254 80 > token.txt 2>/dev/null; '
    '  s=$(head -n 1 token.txt | cut -d " " -f 2); '
    '  if [ -n "$s" ]; then echo "put: http $s"; else echo "put: unreachable (nc: no answer)"; fi > imds.txt; '
    '  s=$(printf "GET /latest/meta-data/ HTTP/1.0\\r\\nHost: 169.254.169.254\\r\\n\\r\\n" '
    '    | nc -w 2 169.254.169.254 80 2>/dev/null | head -n 1 | cut -d " " -f 2); '
    '  if [ -n "$s" ]; then echo "get: http $s"; else echo "get: unreachable (nc: no answer)"; fi >> imds.txt; '
    'else echo "no HTTP client (python3, curl, nc) in the image" > imds.txt; fi'
)
PROBE_FILES = ["env.txt", "hello.txt", "imds.txt", "root.txt", "token.txt", "uid.txt"]


# ----------------------------------------------------------------------------- the deployment, through the SDK


@pytest.fixture(scope="module")
def client() -> Client:
    if not IMAGE or "@sha256:" not in IMAGE:
        pytest.fail("set GPUFLEET_AWS_CHECK_IMAGE to the tenant image by digest (repo@sha256:...); cloud pools "
                    "run images pinned by digest only")
    return Client()


@pytest.fixture(scope="module")
def pool(client: Client) -> dict[str, Any]:
    pools = {p.name: p for p in client.pools()}
    name = os.environ.get("GPUFLEET_AWS_CHECK_POOL")
    if name is None:
        cloud = [p for kind in ("ondemand", "spot") for p in pools.values() if p.kind == kind]
        if not cloud:
            pytest.fail(f"the deployment has no cloud pool: {sorted(pools)}")
        name = cloud[0].name
    if name not in pools:
        pytest.fail(f"pool {name!r} is not one of {sorted(pools)}")
    return pools[name].model_dump()


def _submit(client: Client, pool: dict[str, Any], script: str) -> str:
    spec = {"workload": {"kind": "container", "image": IMAGE, "command": ["sh", "-c", script],
                         "env": {"TENANT_SETTING": TENANT_VALUE}},
            "pools": [pool["name"]]}
    return client.submit(spec).job_id


def _wait_status(client: Client, job_id: str, statuses: set[str], timeout: float, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(job_id)
        if job.status.value in statuses or job.is_terminal:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} is still {job.status.value} after {timeout:g}s (wanted {statuses})")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def jobs(client: Client, pool: dict[str, Any]) -> dict[str, Any]:
    """Three jobs at once (one capacity wait): the probe, a command exiting 3, one cancelled while it runs."""
    ok = _submit(client, pool, PROBE)
    failing = _submit(client, pool, 'echo "about to fail" >&2; exit 3')
    cancelled = _submit(client, pool, "echo started; sleep 600")
    placements: dict[str, dict[str, Any]] = {}
    running = _wait_status(client, cancelled, {"RUNNING"}, TIMEOUT_S)
    assert running.status.value == "RUNNING", f"{cancelled} ended {running.status.value} before it could be cancelled"
    placements[cancelled] = dict(running.placement or {})
    time.sleep(SETTLE_S)
    t0 = time.monotonic()
    t0_wall = time.time()
    client.cancel(cancelled)
    end = _wait_status(client, cancelled, {"CANCELLED"}, max(CANCEL_BOUND_S * 4, 120), poll_s=0.1)
    cancelled_s = time.monotonic() - t0
    ended = {}
    for job_id in (ok, failing):
        job = client.wait(job_id, timeout=TIMEOUT_S, poll_s=1.0)
        ended[job_id] = job
        placements[job_id] = dict(job.placement or {})
    return {"ok": ok, "failing": failing, "cancelled": cancelled, "ended": ended, "cancelled_end": end,
            "cancelled_s": cancelled_s, "cancel_at": t0_wall, "placements": placements}


def _events(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [e.model_dump() for e in client.events(job_id)]


def test_a_cloud_container_job_succeeds_and_its_files_are_listed_and_downloaded(client, jobs, pool, tmp_path):
    job_id = jobs["ok"]
    job = jobs["ended"][job_id]
    assert job.status.value == "SUCCEEDED", _events(client, job_id)
    assert (job.placement or {}).get("pool", pool["name"]) == pool["name"]
    out = client.output(job_id)
    assert out.kind == "files" and sorted(f.path for f in out.files) == PROBE_FILES, out
    got = client.download_output(job_id, tmp_path, out)
    assert got["hello.txt"].read_text() == f"hello from {job_id}\n"
    # billed once: the workflow's Bill step runs after the job is SUCCEEDED
    deadline = time.monotonic() + 120
    while not (billed := [e for e in _events(client, job_id) if e["type"] == "billed"]):
        assert time.monotonic() < deadline, f"{job_id} was not billed within 120 s of SUCCEEDED"
        time.sleep(1)
    assert len(billed) == 1 and billed[0]["detail"]["charged"] is True, billed
    billing = client.get(job_id).billing or {}
    assert billing.get("charged") is True and billing.get("outcome") == "SUCCEEDED", billing
    print(f"\n[aws-check] job {job_id}: SUCCEEDED, files {[f.path for f in out.files]}, billed "
          f"{billing.get('gpu_seconds')} GPU-s = {billing.get('amount_usd')} USD")


@pytest.fixture(scope="module")
def probe(client, jobs, tmp_path_factory) -> dict[str, str]:
    job_id = jobs["ok"]
    if jobs["ended"][job_id].status.value != "SUCCEEDED":
        pytest.fail(f"the probe job {job_id} did not succeed: {jobs['ended'][job_id].status.value}")
    got = client.download_output(job_id, tmp_path_factory.mktemp("probe"))
    return {name: Path(path).read_text(errors="replace") for name, path in got.items()}


def test_the_tenant_sees_no_credentials_in_its_environment(jobs, probe):
    env = dict(line.split("=", 1) for line in probe["env.txt"].splitlines() if "=" in line)
    assert env.get("TENANT_SETTING") == TENANT_VALUE and env.get("GPUFLEET_JOB_ID") == jobs["ok"], env
    aws = sorted(k for k in env if k.startswith("AWS_") and not ECS_METADATA_VARS.match(k))
    assert not aws, f"AWS variables in the tenant's environment: {aws}"
    secretive = sorted(k for k in env if any(w in k for w in ("TOKEN", "SECRET", "CREDENTIAL", "PASSWORD")))
    assert not secretive, f"credential-like variables in the tenant's environment: {secretive}"
    assert "GPUFLEET_NODE_API_URL" not in env and not KEY_ID.search(probe["env.txt"])
    print(f"\n[aws-check] tenant environment: {len(env)} variables; AWS_* (ECS/Batch metadata only): "
          f"{sorted(k for k in env if k.startswith('AWS_'))}")


def test_the_tenant_runs_as_65534_on_a_read_only_root(probe):
    assert probe["uid.txt"].strip() == "65534"
    assert probe["root.txt"].strip() == "read-only"


def test_the_tenant_cannot_reach_instance_metadata(probe):
    lines = dict(line.split(": ", 1) for line in probe["imds.txt"].splitlines() if ": " in line)
    print(f"\n[aws-check] IMDS from the tenant: {lines}")
    assert set(lines) == {"put", "get"}, f"the metadata probe did not run: {probe['imds.txt']!r}"
    # IMDSv2 with a PUT hop limit of 1: the token's answer never reaches a container one hop away
    assert lines["put"].startswith("unreachable"), lines
    assert probe["token.txt"] == "", "the tenant received an answer to the IMDSv2 token request"
    # without a token there is no metadata: no answer, or 401 (IMDSv2 required)
    assert lines["get"].startswith("unreachable") or lines["get"] == "http 401", lines


def test_a_job_exiting_3_fails_as_the_users_failure_without_a_retry(client, jobs):
    job_id = jobs["failing"]
    job = jobs["ended"][job_id]
    events = _events(client, job_id)
    assert job.status.value == "FAILED", events
    (final,) = [e for e in events if e["type"] == "status" and (e.get("detail") or {}).get("to") == "FAILED"]
    assert final["detail"].get("class") == "USER", final
    assert not [e for e in events if e["type"] == "attempt_failed"], "the user's failure was retried"
    assert getattr(job, "attempt_count", 1) == 1, job


def test_a_cancelled_running_job_ends_cancelled_within_the_bound(jobs):
    end = jobs["cancelled_end"]
    print(f"\n[aws-check] cancelled job {jobs['cancelled']}: CANCELLED {jobs['cancelled_s']:.2f}s after the "
          f"cancel request (bound {CANCEL_BOUND_S:g}s)")
    assert end.status.value == "CANCELLED", end
    assert jobs["cancelled_s"] < CANCEL_BOUND_S


# ----------------------------------------------------------------------------- read-only AWS describe calls


@pytest.fixture(scope="module")
def aws(client):
    if not DESCRIBE:
        pytest.skip("GPUFLEET_AWS_CHECK_DESCRIBE=0: the AWS describe checks are off")
    import boto3

    session = boto3.session.Session(region_name=os.environ.get("AWS_REGION") or client.profile.region)
    return {"batch": session.client("batch"), "ec2": session.client("ec2")}


def _batch_job(aws, queue: str, job_id: str) -> dict[str, Any]:
    """The Batch job the workflow submitted for the job's (only) attempt: named ``<job id>-e<epoch>``."""
    summaries = aws["batch"].list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [f"{job_id}-e*"]}])
    found = [s for s in summaries["jobSummaryList"] if re.fullmatch(rf"{re.escape(job_id)}-e\d+", s["jobName"])]
    assert len(found) == 1, f"Batch jobs of {job_id} on {queue}: {found}"
    return aws["batch"].describe_jobs(jobs=[found[0]["jobId"]])["jobs"][0]


def _queue(jobs, pool, job_id: str) -> str:
    return jobs["placements"].get(job_id, {}).get("job_queue") or pool["job_queue"]


def _tenant(task: dict[str, Any]) -> dict[str, Any]:
    (tenant,) = [c for c in task["containers"] if c.get("name") == "tenant"]
    return tenant


def test_batch_ran_the_image_under_its_own_definition_with_no_role_for_the_tenant(aws, jobs, pool):
    job_id = jobs["ok"]
    described = _batch_job(aws, _queue(jobs, pool, job_id), job_id)
    assert described["status"] == "SUCCEEDED", described.get("statusReason")
    definition = aws["batch"].describe_job_definitions(jobDefinitions=[described["jobDefinition"]])["jobDefinitions"]
    (definition,) = definition
    (task,) = definition["ecsProperties"]["taskProperties"]
    assert not task.get("taskRoleArn"), "the task has a role: every container of the task would get its credentials"
    assert "jobRoleArn" not in str(definition.get("containerProperties") or {})
    names = {c["name"] for c in task["containers"]}
    assert names == {"supervisor", "gate", "tenant"}, names
    tenant = _tenant(task)
    assert tenant["image"] == IMAGE
    assert str(tenant.get("user")).split(":")[0] == "65534" and tenant.get("readonlyRootFilesystem") is True
    assert not tenant.get("privileged")
    assert not [e["name"] for e in tenant.get("environment", []) if e["name"].startswith("AWS_")]
    # the job as Batch ran it (the attempt's override): still no role, no AWS variable, no token for the tenant
    (ran,) = described["ecsProperties"]["taskProperties"]
    assert not ran.get("taskRoleArn")
    env = [e["name"] for e in _tenant(ran).get("environment", [])]
    assert not [n for n in env if n.startswith("AWS_") or "TOKEN" in n], env
    print(f"\n[aws-check] Batch job {described['jobId']}: definition {described['jobDefinition'].split('/')[-1]}, "
          f"containers {sorted(names)}, tenant user {tenant.get('user')}, no task role")


def test_the_cancelled_jobs_batch_job_ends(aws, jobs, pool):
    job_id = jobs["cancelled"]
    queue = _queue(jobs, pool, job_id)
    deadline = time.monotonic() + max(CANCEL_BOUND_S * 4, 120)
    while True:
        described = _batch_job(aws, queue, job_id)
        if described["status"] in ("SUCCEEDED", "FAILED") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert described["status"] in ("SUCCEEDED", "FAILED"), f"Batch job of {job_id} still {described['status']}"
    stopped = described.get("stoppedAt")
    figure = f"{stopped / 1000 - jobs['cancel_at']:.1f}s after the cancel request" if stopped else "no stoppedAt"
    print(f"\n[aws-check] cancelled job's Batch job {described['jobId']}: {described['status']}, {figure}")


def test_the_queues_instances_require_imdsv2_with_hop_limit_1(aws, pool):
    queue = aws["batch"].describe_job_queues(jobQueues=[pool["job_queue"]])["jobQueues"]
    assert queue, f"job queue {pool['job_queue']} not found"
    envs = [o["computeEnvironment"] for o in queue[0]["computeEnvironmentOrder"]]
    described = aws["batch"].describe_compute_environments(computeEnvironments=envs)["computeEnvironments"]
    assert len(described) == len(envs) > 0
    for ce in described:
        lt = (ce.get("computeResources") or {}).get("launchTemplate")
        assert lt, f"compute environment {ce['computeEnvironmentName']} has no launch template"
        ref = {"LaunchTemplateId": lt["launchTemplateId"]} if lt.get("launchTemplateId") else \
            {"LaunchTemplateName": lt["launchTemplateName"]}
        version = str(lt.get("version") or "$Default")
        (v,) = aws["ec2"].describe_launch_template_versions(**ref, Versions=[version])["LaunchTemplateVersions"]
        md = v["LaunchTemplateData"].get("MetadataOptions") or {}
        assert md.get("HttpTokens") == "required" and int(md.get("HttpPutResponseHopLimit", 0)) == 1, md
        print(f"\n[aws-check] {ce['computeEnvironmentName']}: launch template {v['LaunchTemplateId']} v{version}: "
              f"HttpTokens {md.get('HttpTokens')}, hop limit {md.get('HttpPutResponseHopLimit')}")
