"""Input staging through the node cache, log chunks, and model weights from S3 cached by content hash."""

from __future__ import annotations

import logging
import os

import pytest

from gpufleet.clock import SystemClock
from gpufleet.errors import NotFound, StaleEpoch, TransientError
from gpufleet.models.loader import ModelLoader, publish_model
from gpufleet.runtime.logs import S3LogHandler
from gpufleet.runtime.staging import Stager
from gpufleet.store.dynamo import unmarshal
from gpufleet.store.fencing import issue_epoch
from gpufleet.store.jobitem import JobItem
from gpufleet.store.objectstore import ObjectStore


def _published(aws, tmp_path, name: str):
    """A small model folder published as ``name`` under s3://gf-rt-models/models/: (objects, content hash, folder)."""
    folder = tmp_path / "published"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    (folder / "weights.bin").write_bytes(b"w" * 1000)
    aws.s3.create_bucket(Bucket="gf-rt-models")
    objects = ObjectStore(aws.s3)
    return objects, publish_model(folder, objects, "s3://gf-rt-models/models/", name), folder


def test_second_job_on_the_node_stages_from_cache_and_the_attempt_records_it(aws, tmp_path):
    aws.s3.create_bucket(Bucket="gf-rt-data")
    aws.s3.put_bucket_versioning(Bucket="gf-rt-data", VersioningConfiguration={"Status": "Enabled"})
    v1 = aws.s3.put_object(Bucket="gf-rt-data", Key="sets/train.bin", Body=b"a" * 5000)["VersionId"]
    aws.s3.put_object(Bucket="gf-rt-data", Key="sets/train.bin", Body=b"b" * 7000)
    objects = ObjectStore(aws.s3)
    stager = Stager(objects, tmp_path / "cache")
    uris = ["s3://gf-rt-data/sets/train.bin", f"s3://gf-rt-data/sets/train.bin?versionId={v1}"]

    first = stager.stage(uris[:1], tmp_path / "job1")
    assert first.bytes_moved == 7000 and first.bytes_cached == 0
    assert (tmp_path / "job1" / "train.bin").read_bytes() == b"b" * 7000
    second = Stager(objects, tmp_path / "cache").stage(uris[:1], tmp_path / "job2")
    assert second.bytes_moved == 0 and second.bytes_cached == 7000
    assert second.inputs == first.inputs
    pinned = stager.stage(uris[1:], tmp_path / "job3")
    assert pinned.bytes_moved == 5000 and (tmp_path / "job3" / "train.bin").read_bytes() == b"a" * 5000

    aws.put_job("job_stage", 1, {})
    aws.ddb.put_item(TableName=aws.tables.jobs, Item={"pk": {"S": "JOB#job_stage"}, "sk": {"S": "ATTEMPT#00000001"}})
    JobItem(aws.tables.jobs, "job_stage", 1, client=aws.ddb, clock=SystemClock()).record_attempt({"staging": second.as_item()})
    got = unmarshal(aws.ddb.get_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_stage"},
                                                                      "sk": {"S": "ATTEMPT#00000001"}})["Item"])
    assert got["staging"]["bytes_cached"] == 7000 and got["staging"]["bytes_moved"] == 0
    issue_epoch(aws.ddb, aws.tables.jobs, "job_stage", 1)
    with pytest.raises(StaleEpoch):
        JobItem(aws.tables.jobs, "job_stage", 1, client=aws.ddb, clock=SystemClock()).record_attempt({"staging": first.as_item()})


def test_log_lines_are_streamed_in_ordered_chunks(aws):
    handler = S3LogHandler(ObjectStore(aws.s3), "gf-rt-logs", "job_log", 3, max_lines=2, interval_s=0,
                             clock=SystemClock())
    logger = logging.getLogger("gpufleet.test.rtlogs")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    for i in range(5):
        logger.info("line %d", i)
    logger.removeHandler(handler)
    handler.close()
    keys = aws.keys("bucket_logs", "jobs/job_log/")
    assert keys == [f"jobs/job_log/attempt-0003/{i:08d}.log" for i in range(3)]
    lines = b"".join(aws.get("bucket_logs", k) for k in keys).decode().splitlines()
    import json

    assert [json.loads(x)["msg"] for x in lines] == [f"line {i}" for i in range(5)]
    assert {json.loads(x)["epoch"] for x in lines} == {3}


def test_model_weights_from_s3_are_cached_by_content_hash(aws, tmp_path):
    folder = tmp_path / "published"
    (folder / "vae").mkdir(parents=True)
    (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    (folder / "vae" / "config.json").write_text('{"z_dim": 16}')
    (folder / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(bytes(range(256)) * 64)
    aws.s3.create_bucket(Bucket="gf-rt-models")
    objects = ObjectStore(aws.s3)
    digest = publish_model(folder, objects, "s3://gf-rt-models/models/", "wan-small")
    loader = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/")
    first = loader.resolve("wan-small")
    assert first.content_hash == digest and first.bytes_downloaded == 256 * 64 + 30 + 13
    assert (first.path / "vae" / "config.json").read_text() == '{"z_dim": 16}'
    assert first.path == tmp_path / "node" / "models" / "sha256" / digest
    again = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/").resolve("wan-small")
    assert again.bytes_downloaded == 0 and again.path == first.path

    with pytest.raises(NotFound):
        loader.resolve("no-such-model")
    aws.s3.put_object(Bucket="gf-rt-models", Key="models/wan-small/vae/config.json", Body=b"{}")
    with pytest.raises(TransientError):
        ModelLoader(tmp_path / "node2", objects, s3_root="s3://gf-rt-models/models/").resolve("wan-small")
    assert not (tmp_path / "node2" / "models" / "sha256" / digest).exists()


def test_the_built_in_model_is_built_where_the_models_root_does_not_publish_it(aws, tmp_path):
    """Every deployment now names its models root on the GPU job definitions (infra/compute.py): a job of the built-in
    model, which an operator did not publish there, still gets it (built offline), not NotFound."""
    from gpufleet.models.tiny_wan import TINY_MODEL_NAME

    aws.s3.create_bucket(Bucket="gf-rt-models")
    loader = ModelLoader(tmp_path / "node", ObjectStore(aws.s3), s3_root="s3://gf-rt-models/models/")
    model = loader.resolve(TINY_MODEL_NAME)
    assert model.path == tmp_path / "node" / "models" / TINY_MODEL_NAME and model.bytes_downloaded == 0
    assert (model.path / "model_index.json").is_file()
    assert loader.prefetch(TINY_MODEL_NAME) is None  # nothing for the agent to fetch


def test_a_tampered_cache_hit_is_detected_and_fetched_again(aws, tmp_path):
    """Every hit is re-verified: a staged input blob or a model file changed on disk is never served."""
    aws.s3.create_bucket(Bucket="gf-rt-data")
    aws.s3.put_object(Bucket="gf-rt-data", Key="sets/x.bin", Body=b"x" * 4000)
    objects = ObjectStore(aws.s3)
    first = Stager(objects, tmp_path / "cache").stage(["s3://gf-rt-data/sets/x.bin"], tmp_path / "job1")
    blob = tmp_path / "cache" / "blobs" / first.inputs["s3://gf-rt-data/sets/x.bin"]
    assert blob.stat().st_mode & 0o777 == 0o444
    os.chmod(blob, 0o644)
    blob.write_bytes(b"evil" * 1000)  # same size, other content
    again = Stager(objects, tmp_path / "cache").stage(["s3://gf-rt-data/sets/x.bin"], tmp_path / "job2")
    assert again.bytes_moved == 4000 and again.bytes_cached == 0
    assert (tmp_path / "job2" / "x.bin").read_bytes() == b"x" * 4000

    objects, digest, _ = _published(aws, tmp_path, "m")
    got = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/").resolve("m")
    (got.path / "weights.bin").write_bytes(b"W" * 1000)  # a poisoned weight file
    again = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/").resolve("m")
    assert again.content_hash == digest and again.bytes_downloaded > 0
    assert (again.path / "weights.bin").read_bytes() == b"w" * 1000


def test_a_cached_model_is_advertised_by_the_name_jobs_use_and_draws_locality_jobs(aws, tmp_path):
    """The node cache keys folders by content hash, jobs name models: the agent advertises the names the
    loader recorded, so a locality job for the model goes to the node that holds it."""
    from gpufleet.pools import parse_pools
    from gpufleet.runtime.hostcache import ContentCache
    from gpufleet.scheduler.cycle import run_cycle
    from gpufleet.scheduler.model import NodeState, PendingJob, Snapshot

    objects, digest, folder = _published(aws, tmp_path, "wan-small")
    publish_model(folder, objects, "s3://gf-rt-models/models/", "wan-small-alias")  # same content, two names
    ModelLoader(tmp_path / "node-b", objects, s3_root="s3://gf-rt-models/models/").resolve("wan-small")
    again = ModelLoader(tmp_path / "node-b", objects, s3_root="s3://gf-rt-models/models/").resolve("wan-small-alias")
    assert again.bytes_downloaded == 0 and again.content_hash == digest  # a hit: the folder's hash is unchanged

    caches = {n: ContentCache(tmp_path / n, 10**9, clock=SystemClock()) for n in ("node-a", "node-b")}
    assert caches["node-b"].keys() == [digest]
    assert caches["node-b"].model_names() == ["wan-small", "wan-small-alias"]
    assert caches["node-a"].model_names() == []

    pools = parse_pools([{"name": "onprem-a", "kind": "onprem", "region": "eu", "gpu_type": "A100", "max_gpus": 16,
                          "price_per_gpu_hour": 0.5}])
    nodes = tuple(NodeState(n, "onprem-a", "A100", (1000,) * 8, 64_000, 512_000, cached_models=frozenset(c.model_names()))
                  for n, c in caches.items())  # node-a first: without the match the packer would pick it
    job = PendingJob("j1", "t", "a", "u", gpu_type="A100", model="wan-small", policy="locality")
    result = run_cycle(Snapshot(now=100.0, jobs=(job,), nodes=nodes, pools=pools))
    assert [m.node for m in result.placements[0].members] == ["node-b"]


def test_a_model_loaded_in_a_warm_worker_needs_only_its_manifest(aws, tmp_path):
    """A warm worker already runs the model from memory: its folder is neither re-hashed nor fetched again."""
    objects, digest, _ = _published(aws, tmp_path, "m")
    loader = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/")
    got = loader.resolve("m")
    (got.path / "weights.bin").write_bytes(b"W" * 1000)  # not what the worker runs: never looked at
    asked = []
    warm = loader.resolve("m", lambda name, h: asked.append((name, h)) or True)
    assert asked == [("m", digest)] and warm.content_hash == digest and warm.bytes_downloaded == 0
    assert (warm.path / "weights.bin").read_bytes() == b"W" * 1000
    cold = loader.resolve("m", lambda name, h: False)  # not loaded: verified, and fetched again
    assert cold.bytes_downloaded > 0 and (cold.path / "weights.bin").read_bytes() == b"w" * 1000


def test_hits_hash_a_model_or_input_only_when_it_changed(aws, tmp_path, monkeypatch):
    """A hit re-verifies from the remembered digest (gpufleet.runtime.verified): once a cached model or blob has been
    hashed, later hits read none of its bytes, until one of its files changes (then it is fetched again, as above)."""
    import time

    from gpufleet.runtime import staging as staging_module
    from gpufleet.runtime import verified

    monkeypatch.setattr(verified, "RACY_MARGIN_NS", 0)  # the test uses files a moment after writing them
    hashed: list[str] = []  # every file read to hash it (a model folder's digest hashes each file with this too)
    real_file = staging_module.file_sha256
    monkeypatch.setattr(staging_module, "file_sha256", lambda p: hashed.append(p.name) or real_file(p))

    objects, _, _ = _published(aws, tmp_path, "m")
    resolve = lambda: ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/").resolve("m")  # noqa: E731
    resolve()  # a miss: downloaded, each file checked against the manifest
    hashed.clear()
    assert resolve().bytes_downloaded == 0 and sorted(hashed) == ["model_index.json", "weights.bin"]  # hashed, recorded
    hashed.clear()
    for _ in range(3):
        assert resolve().bytes_downloaded == 0
    assert hashed == []
    time.sleep(0.03)
    got = resolve()
    (got.path / "weights.bin").write_bytes(b"W" * 1000)  # poisoned after it was remembered
    again = resolve()
    assert again.bytes_downloaded > 0 and (again.path / "weights.bin").read_bytes() == b"w" * 1000

    aws.s3.create_bucket(Bucket="gf-rt-data")
    aws.s3.put_object(Bucket="gf-rt-data", Key="sets/x.bin", Body=b"x" * 4000)
    stage = lambda job: Stager(objects, tmp_path / "node").stage(["s3://gf-rt-data/sets/x.bin"], tmp_path / job)  # noqa: E731
    first = stage("j1")
    blob = tmp_path / "node" / "blobs" / first.inputs["s3://gf-rt-data/sets/x.bin"]
    hashed.clear()
    assert stage("j2").bytes_cached == 4000 and hashed == [blob.name]  # hashed once, then remembered
    for job in ("j3", "j4"):  # each hit marks the blob used (utime), which does not cost a hash
        assert stage(job).bytes_cached == 4000
    assert hashed == [blob.name]
    time.sleep(0.03)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"evil" * 1000)
    assert stage("j5").bytes_moved == 4000 and (tmp_path / "j5" / "x.bin").read_bytes() == b"x" * 4000


def test_a_job_runs_only_the_model_content_it_was_submitted_with(aws, tmp_path):
    """The job's pinned content hash (model_hash, from the model catalog): a model re-published since is refused
    before a byte of it moves, as is a node's local copy that differs; the pinned content resolves as before."""
    from gpufleet.models.loader import ModelChanged, folder_sha256

    objects, digest, folder = _published(aws, tmp_path, "m")
    loader = ModelLoader(tmp_path / "node", objects, s3_root="s3://gf-rt-models/models/")
    assert loader.resolve("m", expect=digest).content_hash == digest
    (folder / "weights.bin").write_bytes(b"v2" * 500)
    publish_model(folder, objects, "s3://gf-rt-models/models/", "m")  # re-published under the same name
    fresh = ModelLoader(tmp_path / "node2", objects, s3_root="s3://gf-rt-models/models/")
    with pytest.raises(ModelChanged) as err:
        fresh.resolve("m", expect=digest)
    assert err.value.status == 400 and err.value.extra["field"] == "workload.model"
    assert not (tmp_path / "node2" / "models" / "sha256").exists() or not any(
        (tmp_path / "node2" / "models" / "sha256").iterdir())  # nothing fetched
    local = tmp_path / "local"
    (local / "m").mkdir(parents=True)
    (local / "m" / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    on_node = ModelLoader(tmp_path / "node3", objects, local_root=str(local))
    with pytest.raises(ModelChanged):
        on_node.resolve("m", expect=digest)
    assert on_node.resolve("m", expect=folder_sha256(local / "m")).path == local / "m"
