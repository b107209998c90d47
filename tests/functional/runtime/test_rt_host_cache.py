"""A Batch GPU instance's host cache (``cache_max_bytes``): the runtime evicts it itself, and leaves no job behind.

Cloud GPU jobs mount the instance's cache (infra/compute.py); no agent looks after it, so a run evicts the least
recently used entries beyond the bound after resolving its model, and removes its staged inputs' folder (hard
links that would keep evicted blobs on the disk) whatever its outcome.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.models.loader import ModelLoader, publish_model
from gpufleet.models.tiny_wan import TINY_MODEL_NAME
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.objectstore import ObjectStore

MODELS = "s3://gf-rt-outputs/models/"


def _attempt(aws, job_id: str) -> dict:
    got = aws.ddb.get_item(TableName=aws.tables.jobs, Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "ATTEMPT#00000001"}},
                           ConsistentRead=True)
    return unmarshal(got["Item"])


def _run(aws, rt, job_id: str, spec: dict, settings: RuntimeSettings) -> int:
    aws.put_job(job_id, 1, spec)
    aws.ddb.put_item(TableName=aws.tables.jobs, Item={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "ATTEMPT#00000001"}})
    return main(["--envelope-json", json.dumps(aws.envelope(job_id, 1, spec))], settings=settings, s3=aws.s3,
                dynamodb=aws.ddb, stdout=io.StringIO(), install_signals=False)


def test_cloud_runs_share_the_host_cache_and_evict_it_themselves(aws, rt, tiny_cache, tmp_path):
    objects = ObjectStore(aws.s3)
    publish_model(tiny_cache / "models" / TINY_MODEL_NAME, objects, MODELS, TINY_MODEL_NAME)
    old = tmp_path / "old-model"
    old.mkdir()
    (old / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    (old / "weights.bin").write_bytes(os.urandom(200_000))
    publish_model(old, objects, MODELS, "old-model")
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="data/cond.bin", Body=b"c" * 3000)

    host = tmp_path / "host-cache"  # what /var/cache/gpufleet is in the container: the instance's disk
    stale = ModelLoader(host, objects, s3_root=MODELS).resolve("old-model")  # an earlier job's model
    past = time.time() - 3600
    os.utime(stale.path, (past, past))
    clock = SystemClock()
    tiny_bytes = sum(p.stat().st_size for p in (tiny_cache / "models" / TINY_MODEL_NAME).rglob("*") if p.is_file())
    settings = RuntimeSettings(
        state_dir=str(tmp_path / "state"), cache_dir=str(host), model_s3_root=MODELS, log_flush_s=0, torch_threads=1,
        tiny_generate_side=32, cache_max_bytes=tiny_bytes + 100_000, cache_min_age_s=60)
    spec = rt.video_spec(steps=2, frames=5)
    spec["data"] = {"inputs": ["s3://gf-rt-outputs/data/cond.bin"]}

    assert _run(aws, rt, "job_hc1", spec, settings) == ExitCode.SUCCEEDED
    first = _attempt(aws, "job_hc1")
    assert first["phases"]["model_cache"] == "miss" and first["phases"]["model_bytes"] > 0
    assert not stale.path.exists()  # the least recently used entry went: the bound is this model and the input
    cache = ContentCache(host, 0, clock=clock)
    assert cache.model_names() == [TINY_MODEL_NAME]
    assert not (host / "jobs" / "job_hc1").exists()  # the staged inputs' folder is gone with the run
    (blob,) = [p for p in (host / "blobs").iterdir()]
    assert blob.stat().st_nlink == 1  # so evicting the blob frees its bytes

    # the next job on the instance: no download, and nothing of the bound's is evicted under it
    assert _run(aws, rt, "job_hc2", spec, settings) == ExitCode.SUCCEEDED
    second = _attempt(aws, "job_hc2")
    assert second["phases"]["model_cache"] == "hit" and second["staging"]["bytes_moved"] == 0
    assert cache.model_names() == [TINY_MODEL_NAME] and blob.exists()


def test_a_run_without_a_bound_evicts_nothing_and_a_failed_run_still_removes_its_inputs(aws, rt, tiny_cache, tmp_path):
    host = tmp_path / "host-cache"
    shutil.copytree(tiny_cache, host)
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="data/cond.bin", Body=b"c" * 3000)
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(host), log_flush_s=0,
                               torch_threads=1, tiny_generate_side=32)
    spec = rt.video_spec(steps=2, frames=5, model="no-such-model")
    spec["data"] = {"inputs": ["s3://gf-rt-outputs/data/cond.bin"]}
    code = _run(aws, rt, "job_hc3", spec, settings)
    assert code != ExitCode.SUCCEEDED  # the model is unknown: after staging, before any step
    assert len(list((host / "blobs").iterdir())) == 1  # on-prem (no bound) the agent evicts, not the runtime
    assert not (host / "jobs" / "job_hc3").exists()


def test_the_bound_is_at_most_half_the_cache_file_system(tmp_path, monkeypatch):
    """A root volume (no instance store) also holds the images: whatever cache_max_bytes says, the runtime keeps the
    cache within half its file system."""
    import hashlib
    import logging
    from collections import namedtuple
    from types import SimpleNamespace

    from gpufleet.runtime import generate

    host = tmp_path / "host-cache"
    cache = ContentCache(host, 1 << 40, clock=SystemClock())
    keys = []
    for i in range(3):
        data = bytes([i]) * 100_000
        (tmp_path / f"b{i}").write_bytes(data)
        keys.append(hashlib.sha256(data).hexdigest())
        os.utime(cache.put(keys[-1], tmp_path / f"b{i}"), (time.time() - 7200 + i, time.time() - 7200 + i))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(generate.shutil, "disk_usage", lambda path: usage(450_000, 0, 450_000))
    ctx = SimpleNamespace(settings=RuntimeSettings(state_dir=str(tmp_path / "s"), cache_dir=str(host),
                                                   cache_max_bytes=1 << 40, cache_min_age_s=60),
                          log=logging.getLogger("test.hostcache"))
    generate.evict_host_cache(ctx, keep=keys[0])
    assert sorted(cache.keys()) == sorted([keys[0], keys[2]])  # within 225 kB: two of three, the oldest other gone


def test_a_cloud_run_refuses_a_model_whose_content_is_not_the_jobs_pin(aws, rt, tiny_cache, tmp_path):
    """The envelope's ``model_hash`` (pinned from the model catalog at submission) reaches the loader: a model
    re-published since the job was admitted fails the attempt as a user error, and nothing of it is fetched."""
    objects = ObjectStore(aws.s3)
    publish_model(tiny_cache / "models" / TINY_MODEL_NAME, objects, MODELS, "wan-pinned")
    host = tmp_path / "host-cache"
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(host), model_s3_root=MODELS,
                               log_flush_s=0, torch_threads=1, tiny_generate_side=32)
    spec = rt.video_spec(steps=2, frames=5)
    spec["workload"]["model"] = "wan-pinned"
    aws.put_job("job_pin", 1, spec)
    aws.ddb.put_item(TableName=aws.tables.jobs, Item={"pk": {"S": "JOB#job_pin"}, "sk": {"S": "ATTEMPT#00000001"}})
    envelope = {**aws.envelope("job_pin", 1, spec), "model_hash": "0" * 64}  # what the job was admitted with
    out = io.StringIO()
    code = main(["--envelope-json", json.dumps(envelope)], settings=settings, s3=aws.s3, dynamodb=aws.ddb, stdout=out,
                install_signals=False)
    assert code == ExitCode.USER_ERROR
    assert "no longer the content this job was submitted with" in out.getvalue()
    assert not (host / "models" / "sha256").exists() or not any((host / "models" / "sha256").iterdir())
