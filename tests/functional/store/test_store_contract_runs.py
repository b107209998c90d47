"""Contract of :class:`gpufleet.store.runs.RunStore`, on the fake and on moto.

The node API's reads (projected to the fields it names), the dispatch record fenced on the job's epoch (a stale
epoch writes nothing), and the gang states: a member moves dispatched → ready → succeeded once each, heartbeats
only for members, and after the first failure no member moves again. The last test runs one seeded random
sequence of gang calls on both backends and requires the same answers.
"""

from __future__ import annotations

import random

import pytest
from store_backends import memory_backend, moto_backend

from gpufleet.errors import StaleEpoch
from gpufleet.status import JobStatus as S
from gpufleet.store.runs import SUPERVISOR_ATTEMPT_FIELDS, SUPERVISOR_CLAIMED_ATTR, SUPERVISOR_TOKEN_ATTR
from gpufleet.tables import JOB_META, job_pk

SPEC = {"workload": {"kind": "video.generate", "prompt": "a red kite"}}


def job_at(backend, job_id: str, epoch: int) -> None:
    backend.jobs.create(tenant="t1", team="team", user="u", spec=SPEC, job_id=job_id)
    backend.jobs.transition(job_id, [S.QUEUED], S.PENDING)
    backend.set_attrs("jobs", (job_pk(job_id), JOB_META), {"current_epoch": epoch})


def test_reads_are_projected_and_missing_items_are_none(backend):
    job_at(backend, "j1", 1)
    runs = backend.runs
    assert runs.job("nope") is None and runs.attempt("j1", 1) is None
    assert runs.job("j1")["spec"]["workload"]["prompt"] == "a red kite"
    projected = runs.job("j1", ("status", "current_epoch", "progress"))
    assert set(projected) == {"pk", "status", "current_epoch"} and projected["current_epoch"] == 1


def test_the_dispatch_record_is_fenced_on_the_jobs_epoch(backend):
    job_at(backend, "j1", 2)
    with pytest.raises(StaleEpoch):
        backend.runs.record_dispatch("j1", 1, "tok-old", 10.0)
    assert backend.runs.attempt("j1", 1) is None
    backend.runs.record_dispatch("j1", 2, "tok", 11.5, inputs=("s3://b/k",))
    att = backend.runs.attempt("j1", 2, ("run_token", "dispatched_at", "inputs", "gang"))
    assert (att["run_token"], att["dispatched_at"], att["inputs"]) == ("tok", 11.5, ["s3://b/k"])
    assert "gang" not in att
    with pytest.raises(StaleEpoch):
        backend.runs.record_dispatch("missing", 1, "tok", 1.0)


def test_a_cloud_dispatch_stores_the_token_hash_fenced_and_the_token_is_claimed_once(backend):
    job_at(backend, "c1", 3)
    runs = backend.runs
    with pytest.raises(StaleEpoch):
        runs.record_cloud_dispatch("c1", 2, "ab" * 32, 1.0)
    assert runs.attempt("c1", 2) is None
    runs.record_cloud_dispatch("c1", 3, "ab" * 32, 2.0, inputs=("s3://b/k",))
    att = runs.attempt("c1", 3, SUPERVISOR_ATTEMPT_FIELDS)
    assert att[SUPERVISOR_TOKEN_ATTR] == "ab" * 32 and att["inputs"] == ["s3://b/k"]
    assert not runs.claim_supervisor_token("c1", 3, "cd" * 32, 3.0)  # another hash
    assert not runs.claim_supervisor_token("c1", 2, "ab" * 32, 3.0)  # another attempt
    assert SUPERVISOR_CLAIMED_ATTR not in runs.attempt("c1", 3, SUPERVISOR_ATTEMPT_FIELDS)
    assert runs.claim_supervisor_token("c1", 3, "ab" * 32, 4.0)
    assert not runs.claim_supervisor_token("c1", 3, "ab" * 32, 5.0)  # once
    assert runs.attempt("c1", 3, SUPERVISOR_ATTEMPT_FIELDS)[SUPERVISOR_CLAIMED_ATTR] == 4.0


def test_gang_members_move_once_each_and_not_after_a_failure(backend):
    job_at(backend, "g1", 1)
    runs = backend.runs
    runs.record_dispatch("g1", 1, "tok", 5.0, members=("n1", "n2", "n3"))
    assert runs.gang_succeeded("g1", 1, "n1", 3.0) is None  # not ready yet
    assert runs.gang_ready("g1", 1, "n1", 6.0) == 1
    assert runs.gang_ready("g1", 1, "n1", 6.5) is None  # counted once
    assert runs.gang_ready("g1", 1, "stranger", 6.5) is None
    assert runs.gang_ready("g1", 1, "n2", 7.0) == 2
    runs.gang_beat("g1", 1, "n2", 8.0)
    runs.gang_beat("g1", 1, "stranger", 8.0)  # not a member: nothing recorded
    att = runs.attempt("g1", 1)
    assert att["gang_beats"] == {"n1": 6.0, "n2": 8.0} and att["gang"]["n2"] == "ready"
    assert runs.gang_succeeded("g1", 1, "n1", 3.25) == (1, 3.25)
    assert runs.gang_succeeded("g1", 1, "n1", 3.25) is None
    assert runs.gang_fail("g1", 1, "n3", "x" * 2000) is True
    assert runs.gang_fail("g1", 1, "n2", "second") is False  # the first failure wins
    assert runs.gang_ready("g1", 1, "n3", 9.0) is None and runs.gang_succeeded("g1", 1, "n2", 1.0) is None
    failed = runs.attempt("g1", 1)["gang_failed"]
    assert failed["node"] == "n3" and len(failed["reason"]) == 1000
    assert runs.gang_fail("g1", 9, "n1", "no such attempt") is False


def _sequence(backend, seed: int) -> list:
    rng = random.Random(seed)
    job_at(backend, "g", 1)
    backend.runs.record_dispatch("g", 1, "tok", 1.0, members=("a", "b", "c"))
    out = []
    for i in range(60):
        node = rng.choice(["a", "b", "c", "z"])
        op = rng.choices(["ready", "beat", "succeeded", "fail"], weights=[4, 3, 4, 1])[0]
        if op == "ready":
            out.append(("ready", node, backend.runs.gang_ready("g", 1, node, float(i))))
        elif op == "beat":
            backend.runs.gang_beat("g", 1, node, float(i))
        elif op == "succeeded":
            out.append(("succeeded", node, backend.runs.gang_succeeded("g", 1, node, rng.random())))
        else:
            out.append(("fail", node, backend.runs.gang_fail("g", 1, node, f"reason {i}")))
    att = backend.runs.attempt("g", 1)
    out.append({k: att.get(k) for k in ("gang", "gang_beats", "gang_ready", "gang_succeeded", "gang_failed")})
    return out


@pytest.mark.parametrize("seed", [3, 8])
def test_fake_and_moto_agree_on_a_random_sequence(seed, clock, ddb, tables):
    memory = _sequence(memory_backend(type(clock)(clock.now())), seed)
    moto = _sequence(moto_backend(type(clock)(clock.now()), ddb, tables), seed)
    assert memory == moto
