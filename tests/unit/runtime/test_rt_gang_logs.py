"""A gang member's log chunks (pure, over a fake object store): members of one attempt share its prefix, so each
numbers its chunks n × world_size + rank and marks its lines with its rank — nobody overwrites anybody."""

from __future__ import annotations

import json
import logging

from gpufleet.clock import FakeClock
from gpufleet.runtime.logs import S3LogHandler


class _Objects:
    def __init__(self) -> None:
        self.put: dict[str, bytes] = {}

    def put_bytes(self, bucket, key, data, content_type=None):
        assert key not in self.put, f"{key} overwritten"
        self.put[key] = data


def _write(objects: _Objects, rank: int | None, chunks: int, world_size: int = 2) -> None:
    handler = S3LogHandler(objects, "logs", "job_g", 3, max_lines=1, interval_s=0, clock=FakeClock(0.0),
                           rank=rank, world_size=world_size)
    log = logging.getLogger(f"gpufleet.test_rt_gang_logs.{rank}")
    log.propagate, log.handlers[:] = False, [handler]
    log.setLevel(logging.INFO)
    for i in range(chunks):
        log.info("line %d of %s", i, rank)
    handler.close()


def test_members_interleave_their_chunks_and_never_overwrite_each_other():
    objects = _Objects()
    _write(objects, 0, 3)
    _write(objects, 1, 2)
    assert sorted(objects.put) == [f"jobs/job_g/attempt-0003/{n:08d}.log" for n in (0, 1, 2, 3, 4)]
    lines = [json.loads(objects.put[k]) for k in sorted(objects.put)]
    assert [(x["rank"], x["msg"]) for x in lines] == [(0, "line 0 of 0"), (1, "line 0 of 1"), (0, "line 1 of 0"),
                                                       (1, "line 1 of 1"), (0, "line 2 of 0")]


def test_a_job_that_is_no_gang_numbers_its_chunks_as_before_without_a_rank():
    objects = _Objects()
    _write(objects, None, 2, world_size=5)
    assert sorted(objects.put) == ["jobs/job_g/attempt-0003/00000000.log", "jobs/job_g/attempt-0003/00000001.log"]
    assert all("rank" not in json.loads(v) for v in objects.put.values())
