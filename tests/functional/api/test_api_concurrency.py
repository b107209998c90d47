"""Races on one Idempotency-Key: 32 truly concurrent submissions through the service layer.

The HTTP path (gateway → Powertools) runs one event at a time per process, like
one Lambda container; many containers race only in DynamoDB. So the race is
driven here with 32 threads calling the same operation the route calls, sharing
one DynamoDB (moto, each request atomic as in DynamoDB).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from api_helpers import VIDEO

from gpufleet.api import service
from gpufleet.errors import GpufleetError
from gpufleet.spec import JobSpec
from gpufleet.store import jobs as job_store
from gpufleet.store.principals import Principal

WHO = Principal(arn="arn:aws:iam::123456789012:user/alice", tenant="t1", team="vision", user="alice")


@pytest.fixture
def settings_kw():
    return {"idempotency_wait_s": 10.0}


def _race(deps, specs):
    barrier = threading.Barrier(len(specs))

    def go(spec):
        barrier.wait()
        try:
            return service.submit(deps, WHO, spec, "one-key")
        except GpufleetError as err:
            return err

    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(go, specs))


def _jobs(deps):
    return job_store.list_jobs(deps.ddb, deps.settings.jobs_table, tenant="t1", secret=b"s", limit=100)[0]


def test_32_identical_concurrent_submissions_one_job_identical_bodies(deps, serialized_dynamodb):
    spec = JobSpec.model_validate(VIDEO)
    results = _race(deps, [spec] * 32)
    assert all(isinstance(r, service.HttpResult) and r.status == 202 for r in results), results
    assert len({r.body for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    jobs = _jobs(deps)
    assert [j["job_id"] for j in jobs] == [results[0].job_id]


def test_32_concurrent_different_payloads_one_key(deps, serialized_dynamodb):
    specs = [
        JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": f"prompt {i}"}}) for i in range(32)
    ]
    results = _race(deps, specs)
    won = [r for r in results if isinstance(r, service.HttpResult)]
    lost = [r for r in results if not isinstance(r, service.HttpResult)]
    assert len(won) == 1 and not won[0].replayed
    assert all(e.status in (409, 422) for e in lost), [(type(e).__name__, e.detail) for e in lost]
    assert [j["job_id"] for j in _jobs(deps)] == [won[0].job_id]


def test_concurrent_handler_calls_never_mix_events(deps, serialized_dynamodb):
    """Powertools keeps the current event in a class attribute; Api.handle must serialise resolution."""
    import json

    from gpufleet.api.app import Api
    from gpufleet.devstack.gateway import build_event

    apis = [Api(deps) for _ in range(8)]
    barrier = threading.Barrier(16)

    def go(i):
        barrier.wait()
        body = json.dumps({"workload": {"kind": "video.generate", "prompt": f"p{i}"}}).encode()
        hdrs = {"Idempotency-Key": f"k{i}", "Content-Type": "application/json"}
        r = apis[i % 8].handle(build_event("POST", "/v1/jobs", hdrs, body, user_arn=WHO.arn))
        return json.loads(r["body"])["spec"]["workload"]["prompt"]

    with ThreadPoolExecutor(16) as pool:
        prompts = list(pool.map(go, range(16)))
    assert prompts == [f"p{i}" for i in range(16)]
