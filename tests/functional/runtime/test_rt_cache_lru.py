"""Cache hits in the runtime refresh an entry's timestamp, so the agent's eviction is least-recently-used.

The runtime's input stager and model loader share the node cache with the agent's
:class:`gpufleet.runtime.hostcache.ContentCache`, which evicts the oldest-used entries first.
"""

from __future__ import annotations

import io
import json
import os
import time

from gpufleet.clock import SystemClock
from gpufleet.envelope import ExitCode
from gpufleet.models.loader import ModelLoader, publish_model
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.runtime.staging import Stager
from gpufleet.store.objectstore import ObjectStore


def _age(path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def test_a_recently_staged_input_survives_eviction_and_an_older_one_goes(aws, tmp_path):
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="data/a.bin", Body=b"a" * 4000)
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="data/b.bin", Body=b"b" * 4000)
    root = tmp_path / "cache"
    objects = ObjectStore(aws.s3)
    first = Stager(objects, root).stage(["s3://gf-rt-outputs/data/a.bin", "s3://gf-rt-outputs/data/b.bin"],
                                        tmp_path / "job1")
    blob_a = root / "blobs" / first.inputs["s3://gf-rt-outputs/data/a.bin"]
    blob_b = root / "blobs" / first.inputs["s3://gf-rt-outputs/data/b.bin"]
    _age(blob_a, 200)  # a was fetched first, b later
    _age(blob_b, 100)

    again = Stager(objects, root).stage(["s3://gf-rt-outputs/data/a.bin"], tmp_path / "job2")  # a hit on a
    assert again.bytes_moved == 0 and again.bytes_cached == 4000

    removed = ContentCache(root, max_bytes=4000, clock=SystemClock()).evict()
    assert removed == [blob_b.name]
    assert blob_a.exists() and not blob_b.exists()


def test_a_recently_resolved_model_survives_eviction_and_an_older_one_goes(aws, tmp_path):
    objects = ObjectStore(aws.s3)
    for name in ("model-a", "model-b"):
        folder = tmp_path / "published" / name
        folder.mkdir(parents=True)
        (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
        (folder / "weights.bin").write_bytes(name.encode() * 500)
        publish_model(folder, objects, "s3://gf-rt-outputs/models/", name)
    root = tmp_path / "cache"

    def loader():
        return ModelLoader(root, objects, s3_root="s3://gf-rt-outputs/models/")

    a, b = loader().resolve("model-a"), loader().resolve("model-b")
    _age(a.path, 200)
    _age(b.path, 100)

    hit = loader().resolve("model-a")
    assert hit.bytes_downloaded == 0 and hit.path == a.path

    clock = SystemClock()
    cache = ContentCache(root, max_bytes=ContentCache(root, 0, clock=clock).stats().bytes // 2, clock=clock)
    assert cache.evict() == [b.content_hash]
    assert a.path.exists() and not b.path.exists()


def test_a_job_stages_its_inputs_into_the_area_the_agent_evicts(aws, tmp_path, oci):
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="data/c.bin", Body=b"c" * 3000)
    spec = {"workload": {"kind": "container", "image": oci.image, "command": ["true"]},
            "data": {"inputs": ["s3://gf-rt-outputs/data/c.bin"]}, "resources": {"gpus": 1}}
    aws.put_job("job_in", 1, spec)
    root = tmp_path / "cache"
    settings = RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(root), log_flush_s=0, **oci.settings)
    code = main(["--envelope-json", json.dumps(aws.envelope("job_in", 1, spec, stage="container"))],
                settings=settings, s3=aws.s3, dynamodb=aws.ddb, stdout=io.StringIO(), install_signals=False)
    assert code == ExitCode.SUCCEEDED
    cache = ContentCache(root, max_bytes=0, clock=SystemClock())
    assert cache.stats().entries == 1 and cache.stats().bytes == 3000
    assert len(cache.evict()) == 1 and cache.stats().entries == 0  # the input blob is under the agent's limit
