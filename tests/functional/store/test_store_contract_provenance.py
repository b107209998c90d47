"""Contract of :class:`gpufleet.store.provenance.ProvenanceIndex`, on the fake and on moto.

An entry is written once per (payload, job); a retried Publish naming the same video re-writes it, another
video is a Conflict. A lookup returns every entry of a payload (payloads of distinct jobs may collide),
oldest first.
"""

from __future__ import annotations

import pytest

from gpufleet.errors import Conflict
from gpufleet.store.provenance import ProvenanceEntry


def entry(job_id: str, payload: str = "a1b2c3d4e5f6", video: str = "v.mp4", at: str = "2026-12-02T09:00:00Z"):
    return ProvenanceEntry(payload, job_id, "k1", f"{job_id}/{video}", f"{job_id}/video.c2pa", "ab" * 32, at)


def test_an_entry_is_written_once_and_a_retry_of_the_same_video_is_accepted(backend):
    idx = backend.provenance
    idx.record(entry("j1"))
    idx.record(entry("j1"))  # a retried Publish
    with pytest.raises(Conflict):
        idx.record(entry("j1", video="other.mp4"))
    assert idx.lookup("a1b2c3d4e5f6") == [entry("j1")]
    assert idx.lookup("000000000000") == []


def test_a_payload_shared_by_two_jobs_finds_both_oldest_first(backend):
    idx = backend.provenance
    idx.record(entry("j2", at="2026-12-02T10:00:00Z"))
    idx.record(entry("j1", at="2026-12-02T09:00:00Z"))
    idx.record(entry("j3", payload="ffffffffffff"))
    assert [e.job_id for e in idx.lookup("a1b2c3d4e5f6")] == ["j1", "j2"]
    assert [e.job_id for e in idx.lookup("ffffffffffff")] == ["j3"]
