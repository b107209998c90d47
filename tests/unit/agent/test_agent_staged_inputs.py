"""Staged inputs advertised by the URI the spec uses: the Stager records each blob's URIs, the cache lists
them most recently used first within a count and a character bound, eviction forgets them, and the agent's
node report carries them (configured datasets first) within the node API's budget."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from types import SimpleNamespace

from gpufleet.clock import SystemClock
from gpufleet.nodeapi.liveness import DATASETS_MAX_CHARS
from gpufleet.runtime.hostcache import ContentCache
from gpufleet.runtime.staging import Stager
from onprem_agent.agent import Agent


class FakeObjects:
    """The two ObjectStore calls staging makes, over a dict; counts downloads."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads = 0

    def head(self, bucket: str, key: str, version: str | None = None) -> dict:
        body = self.objects[f"s3://{bucket}/{key}"]
        return {"ETag": hashlib.md5(body).hexdigest(), "VersionId": version or "v1"}  # noqa: S324 - an ETag

    def download_to(self, bucket: str, key: str, fh: io.RawIOBase, version: str | None = None) -> int:
        self.downloads += 1
        body = self.objects[f"s3://{bucket}/{key}"]
        fh.write(body)
        return len(body)


def _age(path: Path, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))


def test_the_cache_records_and_lists_the_uris_its_blobs_hold(tmp_path):
    objects = FakeObjects({"s3://b/a.bin": b"a" * 100, "s3://b/b.bin": b"b" * 100, "s3://b/same.bin": b"a" * 100})
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    stager = Stager(objects, cache.root)
    report = stager.stage(["s3://b/a.bin", "s3://b/b.bin?versionId=v7"], tmp_path / "job1")
    assert (tmp_path / "job1" / "a.bin").read_bytes() == b"a" * 100
    blob_a, blob_b = (cache.blobs / report.inputs[u] for u in ("s3://b/a.bin", "s3://b/b.bin?versionId=v7"))
    _age(blob_a, 100)
    _age(blob_b, 50)
    # the URI exactly as the spec wrote it (version included), most recently used blob first
    assert cache.input_uris(10, 10_000) == ["s3://b/b.bin?versionId=v7", "s3://b/a.bin"]
    # a second URI with the same content is recorded on the same blob; a hit refreshes the blob (LRU)
    stager.stage(["s3://b/same.bin"], tmp_path / "job2")
    assert objects.downloads == 3 and sorted(os.listdir(cache.blobs)) == sorted({blob_a.name, blob_b.name})
    assert cache.input_uris(10, 10_000) == ["s3://b/a.bin", "s3://b/same.bin", "s3://b/b.bin?versionId=v7"]
    assert cache.input_uris(2, 10_000) == ["s3://b/a.bin", "s3://b/same.bin"]  # the count bound
    assert cache.input_uris(10, 30) == ["s3://b/a.bin", "s3://b/same.bin"]  # the character bound
    # an input staged before records existed is recorded on its next hit
    (cache.inputs / blob_b.name).unlink()
    stager.stage(["s3://b/b.bin?versionId=v7"], tmp_path / "job3")
    assert cache.input_uris(1, 10_000) == ["s3://b/b.bin?versionId=v7"] and objects.downloads == 3
    # an evicted blob's URIs are no longer advertised
    _age(blob_b, 3600)
    cache.max_bytes = 100
    assert cache.evict() == [blob_b.name]
    assert not (cache.inputs / blob_b.name).exists()
    assert "s3://b/b.bin?versionId=v7" not in cache.input_uris(10, 10_000)


def test_prefetch_fills_the_cache_only_and_stops_when_asked(tmp_path):
    objects = FakeObjects({"s3://b/x": b"x" * 10, "s3://b/y": b"y" * 10})
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    stager = Stager(objects, cache.root)
    asked = []
    report = stager.prefetch(["s3://b/x", "s3://b/y"], stop=lambda: len(asked) > 0 or asked.append(1))
    assert report.bytes_moved == 10 and list(report.inputs) == ["s3://b/x"]
    assert cache.input_uris(10, 10_000) == ["s3://b/x"]
    assert not (cache.root / "jobs").exists()
    hit = stager.stage(["s3://b/x"], tmp_path / "job")
    assert hit.bytes_moved == 0 and hit.bytes_cached == 10


def test_the_node_report_carries_configured_datasets_then_staged_inputs_within_the_budget(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=10**9, clock=SystemClock())
    long = "s3://b/" + "k" * 1000
    for i in range(300):  # more than the count bound, about 300 KB of URIs: far over the character budget
        digest = f"{i:064x}"
        (cache.blobs / digest).write_bytes(b"")
        _age(cache.blobs / digest, 1000 - i)
        (cache.inputs / digest).write_text(f'["{long}{i:03d}"]')
    fake = SimpleNamespace(
        cache=cache, s=SimpleNamespace(advertise_inputs=256, datasets=["s3://ops/d", "s3://" + "x" * 2000])
    )
    got = Agent._datasets(fake)
    assert got[0] == "s3://ops/d"  # configured first; a URI longer than a spec allows is left out
    assert all(len(u) <= 1024 for u in got) and sum(map(len, got)) <= DATASETS_MAX_CHARS
    assert got[1] == f"{long}299" and len(got) == 1 + DATASETS_MAX_CHARS // len(got[1])  # newest inputs kept
    fake.s.advertise_inputs = 0
    assert Agent._datasets(fake) == ["s3://ops/d"]
