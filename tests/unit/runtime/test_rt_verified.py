"""Remembered digests of cache entries (gpufleet.runtime.verified): a use hashes only what changed since it was hashed,
every kind of change is seen, a digest taken too close to a write is not remembered, and every day hashes again."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpufleet.models.loader import folder_sha256
from gpufleet.runtime import verified
from gpufleet.runtime.verified import Digests


class Counting:
    """``folder_sha256`` that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> str:
        self.calls += 1
        return folder_sha256(path)


@pytest.fixture
def no_racy_margin(monkeypatch):
    """Files written a moment ago may be remembered (the tests write and then use them at once)."""
    monkeypatch.setattr(verified, "RACY_MARGIN_NS", 0)


def _model(root: Path) -> Path:
    (root / "unet").mkdir(parents=True)
    (root / "unet" / "weights.bin").write_bytes(b"w" * 4096)
    (root / "model_index.json").write_text('{"a": 1}')
    (root / ".complete").write_text("x")  # dot files are not content
    return root


def _tick() -> None:
    """Let the file system's timestamp clock (a few ms per tick) move on before the next change."""
    time.sleep(0.03)


def test_a_second_use_reads_no_file_and_returns_the_same_digest(tmp_path, no_racy_margin):
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache")
    first = digests.digest(model, count)
    assert first == folder_sha256(model) and count.calls == 1
    assert digests.digest(model, count) == first and count.calls == 1
    # another process (a new Digests over the same root) finds the record too
    assert Digests(tmp_path / "cache").digest(model, count) == first and count.calls == 1


@pytest.mark.parametrize("change", ["rewrite same size", "append", "replace by rename", "add a file",
                                    "remove a file", "touch"])
def test_every_kind_of_change_hashes_again(tmp_path, no_racy_margin, change):
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache")
    before = digests.digest(model, count)
    _tick()
    weights = model / "unet" / "weights.bin"
    if change == "rewrite same size":
        with open(weights, "r+b") as fh:
            fh.write(b"X")
    elif change == "append":
        with open(weights, "ab") as fh:
            fh.write(b"X")
    elif change == "replace by rename":
        (model / "unet" / "new.tmp").write_bytes(b"w" * 4096)  # same bytes, another inode
        os.replace(model / "unet" / "new.tmp", weights)
    elif change == "add a file":
        (model / "extra.json").write_text("{}")
    elif change == "remove a file":
        (model / "model_index.json").unlink()
    else:
        os.utime(weights)
    after = digests.digest(model, count)
    assert count.calls == 2, f"{change}: the recorded digest was trusted"
    assert after == folder_sha256(model)
    if change in ("rewrite same size", "append", "add a file", "remove a file"):
        assert after != before


def test_links_and_modes_change_no_byte_and_cost_no_hash(tmp_path, no_racy_margin):
    """A job's input folder hard-links the blob and removes the link when it ends; neither (nor a chmod) changes a
    byte, though each changes the file's ctime: a record survives them."""
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache")
    digests.digest(model, count)
    _tick()
    weights = model / "unet" / "weights.bin"
    os.link(weights, tmp_path / "job-input.bin")
    os.chmod(weights, 0o444)
    (tmp_path / "job-input.bin").unlink()
    digests.digest(model, count)
    assert count.calls == 1


def test_a_digest_taken_right_after_a_write_is_not_remembered(tmp_path):
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache")  # the real margin: the files were written a moment ago
    digests.digest(model, count)
    digests.digest(model, count)
    assert count.calls == 2
    assert not (tmp_path / "cache" / verified.RECORDS).exists() or not any(
        (tmp_path / "cache" / verified.RECORDS).iterdir())


def test_a_change_while_hashing_is_seen_at_the_next_use(tmp_path, no_racy_margin):
    model = _model(tmp_path / "m")
    digests = Digests(tmp_path / "cache")

    def hash_then_change(path: Path) -> str:
        got = folder_sha256(path)
        _tick()
        (path / "model_index.json").write_text('{"a": 2}')  # same size, after its bytes were read
        return got

    digests.digest(model, hash_then_change)
    count = Counting()
    assert digests.digest(model, count) == folder_sha256(model) and count.calls == 1


def test_a_remembered_digest_expires_after_reverify_s(tmp_path, no_racy_margin):
    now = [1000.0]
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache", reverify_s=3600, now=lambda: now[0])
    digests.digest(model, count)
    now[0] += 3599
    digests.digest(model, count)
    assert count.calls == 1
    now[0] += 1
    digests.digest(model, count)  # due a full hash (and remembered again from now)
    assert count.calls == 2
    now[0] += 10
    digests.digest(model, count)
    assert count.calls == 2


def test_reverify_zero_hashes_every_time_and_writes_nothing(tmp_path, no_racy_margin):
    model, count = _model(tmp_path / "m"), Counting()
    digests = Digests(tmp_path / "cache", reverify_s=0)
    for _ in range(3):
        digests.digest(model, count)
    assert count.calls == 3 and not (tmp_path / "cache" / verified.RECORDS).exists()


def test_a_garbled_or_foreign_record_is_ignored(tmp_path, no_racy_margin):
    model, other, count = _model(tmp_path / "m"), _model(tmp_path / "o"), Counting()
    digests = Digests(tmp_path / "cache")
    digests.digest(model, count)
    record = next((tmp_path / "cache" / verified.RECORDS).iterdir())
    record.write_text("{not json")
    digests.digest(model, count)
    assert count.calls == 2
    # a record copied from another entry's (another path) is not this entry's
    digests.digest(other, count)
    other_record = digests._record_path(other)
    rec = json.loads(other_record.read_text())
    rec["digest"] = "0" * 64
    digests._record_path(model).write_text(json.dumps(rec))
    assert digests.digest(model, count) == folder_sha256(model)


def test_touched_keeps_a_file_entrys_record_across_its_own_utime(tmp_path, no_racy_margin):
    blob = tmp_path / "blob"
    blob.write_bytes(b"b" * 100)
    count = Counting()
    digests = Digests(tmp_path / "cache")
    digests.digest(blob, count)
    _tick()
    os.utime(blob)  # a cache hit marks it used
    digests.touched(blob)
    digests.digest(blob, count)
    assert count.calls == 1
    _tick()
    os.utime(blob)  # without touched, the utime is a change like any other
    digests.digest(blob, count)
    assert count.calls == 2


def test_sweep_removes_the_records_of_entries_that_are_gone(tmp_path, no_racy_margin):
    keep, gone = _model(tmp_path / "keep"), _model(tmp_path / "gone")
    digests = Digests(tmp_path / "cache")
    digests.digest(keep, Counting())
    digests.digest(gone, Counting())
    for p in sorted(gone.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    gone.rmdir()
    assert digests.sweep() == 1
    assert [json.loads(p.read_text())["path"] for p in digests.dir.iterdir()] == [str(keep.absolute())]


def test_an_entry_gone_is_file_not_found(tmp_path, no_racy_margin):
    with pytest.raises(FileNotFoundError):
        Digests(tmp_path / "cache").digest(tmp_path / "nothing", Counting())


def test_a_cache_that_cannot_hold_records_still_gives_digests(tmp_path, no_racy_margin):
    model, count = _model(tmp_path / "m"), Counting()
    (tmp_path / "cache").write_text("a file where the records folder would go")
    digests = Digests(tmp_path / "cache")
    assert digests.digest(model, count) == digests.digest(model, count) == folder_sha256(model)
    assert count.calls == 2
