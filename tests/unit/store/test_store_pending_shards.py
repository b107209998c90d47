"""The PENDING queue's gsi3 partitions (gpufleet.tables.pending_partition) and the merge of their pages
(gpufleet.store.snapshot.merge_pending): pure."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.store.snapshot import merge_pending
from gpufleet.tables import PENDING_PARTITIONS, PENDING_SHARDS, pending_partition


@given(st.text(min_size=1, max_size=40))
def test_a_jobs_partition_is_stable_and_one_of_the_read_partitions(job_id):
    assert pending_partition(job_id) == pending_partition(job_id)
    assert pending_partition(job_id) in PENDING_PARTITIONS[1:]


def test_jobs_spread_evenly_over_the_shards():
    counts = Counter(pending_partition(f"job_{i:06d}") for i in range(16_000))
    assert len(counts) == PENDING_SHARDS
    expected = 16_000 / PENDING_SHARDS
    assert max(counts.values()) < 1.1 * expected and min(counts.values()) > 0.9 * expected


@given(st.lists(st.text(alphabet="0123456789#ab", min_size=1, max_size=12), max_size=60),
       st.integers(min_value=1, max_value=len(PENDING_PARTITIONS)), st.one_of(st.none(), st.integers(0, 70)))
def test_merging_sorted_partitions_gives_the_first_limit_of_the_whole_queue(keys, shards, limit):
    items = [{"gsi3sk": k, "n": i} for i, k in enumerate(keys)]
    parts = [sorted((it for j, it in enumerate(items) if j % shards == s), key=lambda it: it["gsi3sk"])
             for s in range(shards)]
    merged = merge_pending(parts, limit)
    whole = sorted(items, key=lambda it: it["gsi3sk"])
    assert [it["gsi3sk"] for it in merged] == [it["gsi3sk"] for it in whole][:limit]
