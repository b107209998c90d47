"""Fixtures for the runtime's functional tests: moto (in-process or a loopback server), tables, buckets, jobs.

- ``aws``: ``mock_aws`` with the gpufleet tables and three buckets; yields clients.
- ``moto_server``: a ``ThreadedMotoServer`` on 127.0.0.1 (one per session; tables and buckets re-ensured per test) for runtime
  processes started by :class:`gpufleet.runtime.launcher.PrewarmedLauncher`.
- ``make_job`` / ``envelope``: a job item at a given epoch, and its envelope.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest
from fast_moto import fast_mock_aws
from moto.server import ThreadedMotoServer

from gpufleet.local import moto_patches
from gpufleet.store.dynamo import marshal
from gpufleet.store.schema import create_tables
from gpufleet.tables import JOB_META, TableNames, job_pk

BUCKETS = {"bucket_outputs": "gf-rt-outputs", "bucket_checkpoints": "gf-rt-checkpoints", "bucket_logs": "gf-rt-logs"}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


class Aws:
    def __init__(self, ddb, s3) -> None:
        self.ddb = ddb
        self.s3 = s3
        self.tables = TableNames()
        self.ensure()

    def ensure(self) -> None:
        """Create the tables and buckets that are missing (existing ones are left alone)."""
        create_tables(self.ddb, self.tables)
        have = {b["Name"] for b in self.s3.list_buckets().get("Buckets", [])}
        for b in set(BUCKETS.values()) - have:
            self.s3.create_bucket(Bucket=b)

    def put_job(self, job_id: str, epoch: int, spec: dict, **extra) -> None:
        item = {"pk": job_pk(job_id), "sk": JOB_META, "job_id": job_id, "status": "RUNNING",
                "current_epoch": epoch, "spec": spec, **extra}
        self.ddb.put_item(TableName=self.tables.jobs, Item=marshal(item))

    def job(self, job_id: str) -> dict:
        from gpufleet.store.dynamo import unmarshal

        got = self.ddb.get_item(TableName=self.tables.jobs, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_META}},
                                ConsistentRead=True)
        return unmarshal(got["Item"])

    def get(self, bucket_field: str, key: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKETS[bucket_field], Key=key)["Body"].read()

    def keys(self, bucket_field: str, prefix: str = "") -> list[str]:
        resp = self.s3.list_objects_v2(Bucket=BUCKETS[bucket_field], Prefix=prefix)
        return [o["Key"] for o in resp.get("Contents", [])]

    def envelope(self, job_id: str, epoch: int, spec: dict, stage: str = "generate", **extra) -> dict:
        return {"job_id": job_id, "attempt": epoch, "epoch": epoch, "stage": stage, "spec": spec,
                "s3": {**BUCKETS, "output_prefix": f"jobs/{job_id}/", "checkpoint_prefix": f"jobs/{job_id}/",
                       "log_prefix": f"jobs/{job_id}/attempt-{epoch:04d}/"},
                "tables": {"jobs": self.tables.jobs}, **extra}


@pytest.fixture
def aws(monkeypatch):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with fast_mock_aws(), moto_patches.patch_dynamodb_serialised():  # the runtime's threads write the job item at once
        yield Aws(boto3.client("dynamodb"), boto3.client("s3"))


@pytest.fixture
def moto_server(_moto_server_process):
    """(endpoint, Aws) of the session's loopback moto server, its tables and buckets present: the server
    shares moto's in-process backends, which a ``mock_aws`` test (the ``aws`` fixture) resets."""
    endpoint, aws = _moto_server_process
    aws.ensure()
    return endpoint, aws


@pytest.fixture(scope="session")
def _moto_server_process():
    """A loopback moto server shared by the runtime processes of a test session; yields (endpoint, Aws)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
              aws_secret_access_key="testing")
    aws = Aws(boto3.client("dynamodb", **kw), boto3.client("s3", **kw))
    yield endpoint, aws
    server.stop()


def video_spec(prompt: str = "a red fox running in snow", **kw) -> dict:
    return {"workload": {"kind": "video.generate", "prompt": prompt, "width": 256, "height": 256, "frames": 9,
                         "steps": 8, "seed": 11, **kw}}


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def wait_for(pred, timeout: float = 60.0, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """A node cache holding the saved tiny model (built once per session)."""
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME, save_tiny_wan

    cache = tmp_path_factory.mktemp("node-cache")
    save_tiny_wan(cache / "models" / TINY_MODEL_NAME)
    return cache


@pytest.fixture(scope="session")
def launcher():
    from gpufleet.runtime.launcher import PrewarmedLauncher

    return PrewarmedLauncher()


def child_env(endpoint: str, cache: Path, state: Path, **settings) -> dict[str, str]:
    env = {**AWS_ENV, "AWS_ENDPOINT_URL": endpoint, "GPUFLEET_CACHE_DIR": str(cache),
           "GPUFLEET_STATE_DIR": str(state), "GPUFLEET_PROGRESS_INTERVAL_S": "0", "GPUFLEET_TINY_GENERATE_SIDE": "32",
           "GPUFLEET_LOG_FLUSH_S": "0", "GPUFLEET_TORCH_THREADS": "1"}
    for k, v in settings.items():
        env[f"GPUFLEET_{k.upper()}"] = str(v)
    return env


@pytest.fixture(scope="session")
def oci():
    """Tenant containers on this machine (:class:`gpufleet.local.oci_image.LocalOci`): the tools image (built
    once, reused across sessions) and the runtime settings that reach it; skips where podman cannot run."""
    import shutil

    from gpufleet.local import oci_image

    reason = oci_image.local_oci_unavailable()
    if reason:
        pytest.skip(f"tenant containers unavailable: {reason}")
    local = oci_image.prepare_local()
    yield local
    shutil.rmtree(local.jobs_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def rt():
    """Helpers shared by the runtime tests (fixtures, because conftest modules are not importable)."""
    from types import SimpleNamespace

    return SimpleNamespace(BUCKETS=BUCKETS, AWS_ENV=AWS_ENV, video_spec=video_spec, read_events=read_events,
                           wait_for=wait_for, child_env=child_env)
