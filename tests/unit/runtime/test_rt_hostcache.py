"""The node's content-addressed LRU cache: verified installs, LRU eviction to the size limit,
pinned entries survive, concurrent fetches load once, and the runtime loader's layout is shared."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from gpufleet.clock import SystemClock
from gpufleet.errors import BadRequest, ValidationFailed
from gpufleet.runtime.hostcache import ContentCache, tree_sha256


def _blob(tmp: Path, name: str, size: int, fill: bytes) -> tuple[Path, str]:
    p = tmp / name
    data = (fill * size)[:size]
    p.write_bytes(data)
    return p, hashlib.sha256(data).hexdigest()


def _age(cache: ContentCache, key: str, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(cache.path(key), (t, t))


def test_put_get_and_lru_eviction(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=2500, clock=SystemClock())
    keys = []
    for i, fill in enumerate((b"a", b"b", b"c")):
        src, key = _blob(tmp_path, f"f{i}", 1000, fill)
        cache.put(key, src)
        _age(cache, key, 100 - i)  # a oldest, c newest
        keys.append(key)
    # 3000 bytes > 2500: the least recently used (a) was evicted when c went in
    assert cache.keys() == sorted(keys[1:])
    assert cache.get(keys[0]) is None
    assert cache.get(keys[1]) is not None  # b is now the most recently used
    src, key_d = _blob(tmp_path, "f3", 1000, b"d")
    cache.put(key_d, src)
    assert set(cache.keys()) == {keys[1], key_d}  # c (older than the refreshed b) went
    st = cache.stats()
    assert (st.hits, st.misses, st.evictions, st.entries, st.bytes) == (1, 1, 2, 2, 2000)


def test_pinned_entries_are_not_evicted(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=1500, clock=SystemClock())
    src, key_a = _blob(tmp_path, "a", 1000, b"a")
    cache.put(key_a, src)
    _age(cache, key_a, 50)
    with cache.pinned(key_a) as p:
        assert p is not None and p.read_bytes() == b"a" * 1000
        src, key_b = _blob(tmp_path, "b", 1000, b"b")
        cache.put(key_b, src)
        assert set(cache.keys()) == {key_a, key_b}  # over the limit while a job holds a
    cache.evict()
    assert cache.keys() == [key_b]


def test_recently_used_entries_and_runtime_blobs(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=1500, min_age_s=60, clock=SystemClock())
    src, key_a = _blob(tmp_path, "a", 1000, b"a")
    cache.put(key_a, src)
    # an input the runtime's Stager put in <cache>/blobs, long ago: the LRU covers it too
    blob_data = b"i" * 1000
    blob_key = hashlib.sha256(blob_data).hexdigest()
    (cache.blobs / blob_key).write_bytes(blob_data)
    old = time.time() - 3600
    os.utime(cache.blobs / blob_key, (old, old))
    assert cache.evict() == [blob_key]
    assert cache.stats().bytes == 1000
    src, key_b = _blob(tmp_path, "b", 1000, b"b")
    cache.put(key_b, src)
    assert set(cache.keys()) == {key_a, key_b}  # a was used under a minute ago: kept, over the limit
    _age(cache, key_a, 120)
    assert cache.evict() == [key_a]


def test_digest_is_verified_and_keys_are_checked(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    src, key = _blob(tmp_path, "x", 10, b"x")
    with pytest.raises(ValidationFailed):
        cache.put("0" * 64, src)
    with pytest.raises(BadRequest):
        cache.get("../etc/passwd")
    with pytest.raises(ValidationFailed):
        cache.fetch(key, lambda p: p.write_bytes(b"corrupt"))
    assert cache.keys() == [] and list(cache.tmp.iterdir()) == []


def test_concurrent_fetches_load_once(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    data = b"weights" * 100
    key = hashlib.sha256(data).hexdigest()
    loads = []

    def loader(p: Path) -> None:
        loads.append(1)
        time.sleep(0.2)
        p.write_bytes(data)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.fetch(key, loader))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1
    assert sorted(hit for _, hit in results) == [False, True, True, True]
    assert all(p.read_bytes() == data for p, _ in results)


def test_directory_entries_share_the_model_loaders_layout_and_hash(tmp_path):
    from gpufleet.models.loader import folder_manifest, manifest_bytes
    from gpufleet.store.objectstore import sha256_hex

    model = tmp_path / "model"
    (model / "transformer").mkdir(parents=True)
    (model / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    (model / "transformer" / "weights.bin").write_bytes(b"\x00\x01" * 50)
    key = sha256_hex(manifest_bytes(folder_manifest(model)))
    assert tree_sha256(model) == key
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    dest = cache.put(key, model)
    # the runtime's ModelLoader looks for <cache_dir>/models/sha256/<hash>/.complete
    assert dest == tmp_path / "c" / "models" / "sha256" / key
    assert (dest / ".complete").read_text() == key
    assert tree_sha256(dest) == key  # the marker is a dot file: not part of the content hash


def test_a_hit_is_reverified_and_a_tampered_entry_is_a_miss(tmp_path):
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    src, key = _blob(tmp_path, "f", 1000, b"a")
    p = cache.put(key, src)
    assert cache.get(key) == p
    p.write_bytes(b"b" * 1000)  # tampered with on disk
    assert cache.get(key) is None and not p.exists()
    cache.put(key, src)
    p.write_bytes(b"c" * 1000)
    loads = []
    got, hit = cache.fetch(key, lambda dest: (loads.append(1), dest.write_bytes(b"a" * 1000)))
    assert not hit and loads == [1] and got.read_bytes() == b"a" * 1000
    st = cache.stats()
    assert (st.hits, st.misses) == (1, 2)


def test_a_remembered_hit_reads_nothing_and_eviction_forgets_it(tmp_path, monkeypatch):
    """Hits re-verify from the remembered digest (gpufleet.runtime.verified); a changed entry is still a miss; an
    evicted entry's record goes with it."""
    from gpufleet.runtime import hostcache, verified

    monkeypatch.setattr(verified, "RACY_MARGIN_NS", 0)
    hashed = []
    real = hostcache.content_sha256
    monkeypatch.setattr(hostcache, "content_sha256", lambda p: hashed.append(p.name) or real(p))
    cache = ContentCache(tmp_path / "c", max_bytes=1500, clock=SystemClock())
    src, key = _blob(tmp_path, "f", 1000, b"a")
    p = cache.put(key, src)
    hashed.clear()
    for _ in range(3):
        assert cache.get(key) == p
    assert hashed == [key]  # the first hit hashed and remembered; a hit's utime is not a change
    time.sleep(0.03)
    p.write_bytes(b"b" * 1000)
    assert cache.get(key) is None and not p.exists()
    p = cache.put(key, src)
    assert cache.get(key) == p and cache.digests._record_path(p).exists()
    _age(cache, key, 100)
    src_b, key_b = _blob(tmp_path, "g", 1000, b"b")
    cache.put(key_b, src_b)  # over the bound: the older entry goes, and its record
    assert not p.exists() and not cache.digests._record_path(p).exists()


def test_a_folder_digest_streams_its_files_and_hashes_them_side_by_side(tmp_path):
    """The manifest of a model folder (what every cache hit re-verifies) is the per-file SHA-256 of each file,
    read in 1 MiB chunks — a multi-GB shard never sits in memory whole — with the files hashed concurrently."""
    import hashlib
    import json
    import tracemalloc

    from gpufleet.models.loader import folder_manifest, manifest_bytes
    from gpufleet.runtime.staging import files_sha256

    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    blobs = {"model_index.json": b"{}", "a.safetensors": os.urandom(24 << 20), "sub/b.bin": os.urandom(3 << 20),
             ".complete": b"x"}
    for rel, data in blobs.items():
        (folder / rel).write_bytes(data)
    want = {rel: hashlib.sha256(data).hexdigest() for rel, data in blobs.items() if not rel.startswith(".")}
    tracemalloc.start()
    try:
        manifest = folder_manifest(folder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert manifest == {"files": want}
    assert peak < 12 << 20  # chunks, not the 24 MiB shard (a whole-file read peaks above it)
    body = json.dumps({"files": want}, sort_keys=True, separators=(",", ":")).encode()
    assert tree_sha256(folder) == hashlib.sha256(body).hexdigest() == hashlib.sha256(manifest_bytes(manifest)).hexdigest()
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    assert files_sha256(paths, workers=3) == files_sha256(paths, workers=1) == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_an_eviction_sweeps_what_killed_writers_left_and_spares_live_ones(tmp_path):
    """A download, a staged blob, an install or the tiny model's build cut short by a SIGKILL stays behind (its
    writer's ``finally`` never ran) and would hold the disk for good: every eviction removes those untouched for an
    hour; one still being written, and the cache's entries, stay."""
    from gpufleet.runtime.hostcache import STALE_PARTIAL_S

    cache = ContentCache(tmp_path, max_bytes=1 << 30, clock=SystemClock())
    old = time.time() - STALE_PARTIAL_S - 60

    def left(path, age=old, *, folder=False):
        if folder:
            (path / "sub").mkdir(parents=True)
            (path / "sub" / "w.bin").write_bytes(b"x" * 1000)
            for p in (path / "sub" / "w.bin", path / "sub", path):
                os.utime(p, (age, age))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 1000)
            os.utime(path, (age, age))
        return path

    stale = [left(tmp_path / "models" / "sha256" / ".dl-abc", folder=True), left(tmp_path / "blobs" / ".part-x1"),
             left(tmp_path / "tmp" / f"{'a' * 64}.123.ffff", folder=True),
             left(tmp_path / "models" / ".tiny-wan-q", folder=True)]
    live = left(tmp_path / "models" / "sha256" / ".dl-live", folder=True)
    os.utime(live / "sub" / "w.bin")  # its writer is still writing: a file in it is fresh, its folders are not
    entry = cache.put(hashlib.sha256(b"x" * 1000).hexdigest(), left(tmp_path / "src.bin"))
    os.utime(entry, (old, old))  # an old entry is no partial: eviction by size alone decides on it
    assert cache.evict() == []
    assert not any(p.exists() for p in stale) and live.exists() and entry.exists()
    assert cache.sweep_partials() == []  # nothing left to sweep


def test_scrub_finds_what_a_remembered_digest_cannot_see(tmp_path, monkeypatch):
    """Bytes changed with the file's identity kept (a failing disk; or a write with its times set back) pass a
    remembered hit; a scrub hashes everything, removes the corrupt entry, and leaves one a job holds to its next use."""
    from gpufleet.runtime import verified

    monkeypatch.setattr(verified, "RACY_MARGIN_NS", 0)
    cache = ContentCache(tmp_path / "c", max_bytes=10_000, clock=SystemClock())
    entries = {}
    for name, fill in (("good", b"g"), ("bad", b"b"), ("held", b"h")):
        src, key = _blob(tmp_path, name, 1000, fill)
        entries[name] = (cache.put(key, src), key)
        assert cache.get(key) is not None  # hashed and remembered

    def corrupt_silently(p: Path) -> None:
        st = p.stat()
        os.chmod(p, 0o644)
        p.write_bytes(b"x" * 1000)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # the identity the record holds

    for name in ("bad", "held"):
        corrupt_silently(entries[name][0])
    assert cache.get(entries["bad"][1]) is not None  # the record is trusted: the limit scrub exists for
    with cache.pinned(entries["held"][1]):
        report = cache.scrub()
    assert (report.entries, report.bytes) == (3, 3000)
    assert report.removed == (entries["bad"][1],) and report.held == (entries["held"][1],)
    assert report.as_dict()["corrupt"] == 2
    assert not entries["bad"][0].exists() and cache.get(entries["bad"][1]) is None
    assert entries["held"][0].exists()
    assert cache.get(entries["held"][1]) is None and not entries["held"][0].exists()  # its next use hashed it
    assert cache.get(entries["good"][1]) == entries["good"][0]
    assert cache.scrub().as_dict()["corrupt"] == 0
