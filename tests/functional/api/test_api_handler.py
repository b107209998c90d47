"""The API handler on moto: every rule of POST/GET/list/DELETE/events and the problem mapping."""

from __future__ import annotations

import pytest
from api_helpers import ALICE, BOB, CAROL, STRANGER, VIDEO

from gpufleet.status import JobStatus as S
from gpufleet.store import jobs as job_store


def submit(call, key="k-1", body=VIDEO, arn=ALICE):
    return call("POST", "/v1/jobs", body, headers={"Idempotency-Key": key}, arn=arn)


def test_submit_202_location_and_get(call):
    r = submit(call)
    assert r.status == 202, r.text
    job = r.json
    assert r.headers["location"] == f"/v1/jobs/{job['job_id']}"
    assert job["status"] == "QUEUED" and job["owner"] == "t1/vision/alice"
    assert job["spec"]["workload"]["prompt"] == VIDEO["workload"]["prompt"]
    assert "idempotent-replayed" not in r.headers
    g = call("GET", r.headers["location"])
    assert g.status == 200 and g.json == job


def test_idempotency_key_required_and_validated(call):
    r = call("POST", "/v1/jobs", VIDEO)
    assert r.status == 400 and r.headers["content-type"] == "application/problem+json"
    assert "Idempotency-Key" in r.json["detail"]
    assert submit(call, key="has space").status == 400


def test_replay_same_key_same_payload(call):
    first = submit(call)
    again = submit(call)
    assert again.status == first.status == 202
    assert again.text == first.text and again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"


def test_same_key_different_payload_is_422(call):
    submit(call)
    other = {"workload": {"kind": "video.generate", "prompt": "a blue whale"}}
    r = submit(call, body=other)
    assert r.status == 422 and r.json["type"].endswith("/idempotency-mismatch")


def test_key_is_scoped_per_tenant(call):
    a = submit(call, arn=ALICE)
    c = submit(call, arn=CAROL)
    assert c.status == 202 and c.json["job_id"] != a.json["job_id"] and "idempotent-replayed" not in c.headers


def test_in_flight_is_409(call, deps):
    from gpufleet.store import idempotency as idem

    body_hash = __import__("gpufleet.spec", fromlist=["JobSpec"]).JobSpec.model_validate(VIDEO).fingerprint()
    idem.begin(deps.ddb, deps.settings.control_table, "t1", "busy", body_hash, clock=deps.clock, wait_s=0)
    r = submit(call, key="busy")
    assert r.status == 409 and r.json["type"].endswith("/idempotency-in-flight")


def test_invalid_spec_is_400_problem_and_not_remembered(call):
    bad = {"workload": {"kind": "video.generate", "prompt": "x", "frames": 10}}
    r = submit(call, body=bad)
    assert r.status == 400 and r.json["type"].endswith("/validation") and r.json["errors"]
    assert submit(call, body=VIDEO).status == 202  # the key was not consumed by the invalid request
    assert call("POST", "/v1/jobs", b"{not json", headers={"Idempotency-Key": "z"}).status == 400
    # Found by schemathesis: a valid float DynamoDB cannot store is a 400, not a 500.
    tiny = {"workload": {"kind": "video.generate", "prompt": "x", "guidance": 1e-200}}
    t = submit(call, key="tiny", body=tiny)
    assert t.status == 400 and t.json["type"].endswith("/validation")


def test_unknown_principal_403_and_other_tenant_404(call):
    r = submit(call, arn=STRANGER)
    assert r.status == 403 and r.json["type"].endswith("/forbidden")
    assert call("GET", "/v1/jobs", arn=None).status == 403
    job = submit(call).json
    for method, suffix in (
        ("GET", ""),
        ("DELETE", ""),
        ("GET", "/events"),
        ("GET", "/logs"),
        ("GET", "/webhooks"),
        ("GET", "/output"),
    ):
        other = call(method, f"/v1/jobs/{job['job_id']}{suffix}", arn=CAROL)
        missing = call(method, f"/v1/jobs/job_01hzzzzzzzzzzzzzzzzzzzzzzz{suffix}", arn=ALICE)
        assert other.status == missing.status == 404, (method, suffix, other.text)
        assert other.json["type"] == missing.json["type"]
    assert call("GET", "/v1/jobs", arn=CAROL).json["jobs"] == []
    assert call("GET", f"/v1/jobs/{job['job_id']}").json["cancel_requested"] is False


@pytest.mark.parametrize("settings_kw", [{"queued_jobs_per_user": 2, "queued_jobs_per_team": 3}])
def test_soft_quota_429_names_the_limit(call, deps):
    assert submit(call, key="a1").status == 202
    assert submit(call, key="a2").status == 202
    r = submit(call, key="a3")
    assert r.status == 429 and int(r.headers["retry-after"]) == deps.settings.quota_retry_after_s
    assert r.json["limit"] == "queued_jobs_per_user" and r.json["limit_value"] == 2
    assert submit(call, key="b1", arn=BOB).status == 202
    t = submit(call, key="b2", arn=BOB)
    assert t.status == 429 and t.json["limit"] == "queued_jobs_per_team"
    # A job leaving the queue frees the slot; the rejected key was not consumed.
    first = call("GET", "/v1/jobs?mine=true", arn=ALICE).json["jobs"][-1]
    job_store.transition(deps.ddb, deps.settings.jobs_table, first["job_id"], [S.QUEUED], S.REJECTED, clock=deps.clock)
    assert submit(call, key="a3").status == 202


def test_list_filters_paging_and_forged_cursor(call, deps):
    ids = []
    for i in range(5):
        ids.append(submit(call, key=f"l{i}", arn=ALICE if i % 2 == 0 else BOB).json["job_id"])
        deps.clock.advance(1)
    page = call("GET", "/v1/jobs?limit=2")
    assert page.status == 200 and [j["job_id"] for j in page.json["jobs"]] == ids[::-1][:2]
    nxt = call("GET", f"/v1/jobs?limit=2&cursor={page.json['next_cursor']}").json
    assert [j["job_id"] for j in nxt["jobs"]] == ids[::-1][2:4]
    cur = page.json["next_cursor"]
    forged = cur[:-5] + ("A" if cur[-5] != "A" else "B") + cur[-4:]
    bad = call("GET", f"/v1/jobs?limit=2&cursor={forged}")
    assert bad.status == 400 and bad.json["param"] == "cursor"
    mine = call("GET", "/v1/jobs?mine=true", arn=BOB).json["jobs"]
    assert [j["job_id"] for j in mine] == [ids[3], ids[1]]
    assert [j["job_id"] for j in call("GET", "/v1/jobs?user=bob", arn=ALICE).json["jobs"]] == [ids[3], ids[1]]
    assert call("GET", "/v1/jobs?user=bob", arn=CAROL).json["jobs"] == []  # another tenant's bob: not Carol's
    assert call("GET", "/v1/jobs?user=bob&mine=true", arn=ALICE).status == 400
    job_store.transition(deps.ddb, deps.settings.jobs_table, ids[0], [S.QUEUED], S.REJECTED, clock=deps.clock)
    rej = call("GET", "/v1/jobs?status=REJECTED&status=FAILED").json["jobs"]
    assert [j["job_id"] for j in rej] == [ids[0]]
    created = [call("GET", f"/v1/jobs/{i}").json["created_at"] for i in ids]
    win = call("GET", f"/v1/jobs?created_after={created[1]}&created_before={created[3]}").json["jobs"]
    assert [j["job_id"] for j in win] == [ids[2], ids[1]]
    for q in ("limit=0", "limit=101", "status=NOPE", "created_after=yesterday", "created_after=2026-01-01T00:00:00", "user=%2Fbob"):
        r = call("GET", f"/v1/jobs?{q}")
        assert r.status == 400 and r.headers["content-type"] == "application/problem+json", q


def test_cancel_idempotent_and_terminal_409(call, deps):
    job = submit(call).json
    a = call("DELETE", f"/v1/jobs/{job['job_id']}")
    b = call("DELETE", f"/v1/jobs/{job['job_id']}")
    assert a.status == b.status == 202 and a.json["cancel_requested"] is True and a.text == b.text
    other = submit(call, key="k2").json
    job_store.transition(deps.ddb, deps.settings.jobs_table, other["job_id"], [S.QUEUED], S.REJECTED, clock=deps.clock)
    r = call("DELETE", f"/v1/jobs/{other['job_id']}")
    assert r.status == 409 and r.json["current_status"] == "REJECTED"
    assert call("DELETE", f"/v1/jobs/{other['job_id']}").status == 409
    kinds = [e["type"] for e in call("GET", f"/v1/jobs/{job['job_id']}/events").json["events"]]
    assert kinds == ["created", "cancel_requested"]


def test_events_timeline(call, deps):
    job = submit(call).json
    job_store.transition(deps.ddb, deps.settings.jobs_table, job["job_id"], [S.QUEUED], S.PENDING, clock=deps.clock)
    r = call("GET", f"/v1/jobs/{job['job_id']}/events")
    assert r.status == 200 and [e["type"] for e in r.json["events"]] == ["created", "status"]
    assert r.json["events"][1]["detail"]["to"] == "PENDING"


def test_openapi_and_unknown_route(call):
    r = call("GET", "/v1/openapi.json")
    assert r.status == 200 and r.json["openapi"].startswith("3.1")
    assert "/v1/jobs/{job_id}/logs" in r.json["paths"]
    nf = call("GET", "/v2/nothing")
    assert nf.status == 404 and nf.headers["content-type"] == "application/problem+json"


def test_cancel_of_parked_job_propagates_through_lifecycle(call, deps, monkeypatch):
    from gpufleet.lifecycle import cancel as cancel_mod

    seen = []
    real = cancel_mod.propagate

    def spy(job, **kw):
        out = real(job, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(cancel_mod, "propagate", spy)
    job = submit(call).json
    job_store.transition(
        deps.ddb,
        deps.settings.jobs_table,
        job["job_id"],
        [S.QUEUED],
        S.PENDING,
        {"placement_token": "token-of-a-finished-task"},
        clock=deps.clock,
    )
    r = call("DELETE", f"/v1/jobs/{job['job_id']}")
    assert r.status == 202 and r.json["status"] == "PENDING"
    assert seen and seen[0]["actions"] in (["placement_token_failed"], ["placement_token_gone"])


def test_structured_logs_carry_the_job_id_and_emf_metrics_are_emitted(call, capsys):
    import io
    import json as _json
    import logging

    from gpufleet.api.app import logger

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logger.registered_formatter)  # the JSON formatter the Lambda logs with
    std = logging.getLogger("gpufleet-api")
    std.addHandler(handler)
    capsys.readouterr()
    try:
        job = submit(call, key="obs").json
    finally:
        std.removeHandler(handler)
    logs = [_json.loads(x) for x in buf.getvalue().splitlines() if x.strip()]
    submitted = [x for x in logs if x["message"] == "job submitted"]
    assert submitted and submitted[0]["correlation_id"] == job["job_id"] == submitted[0]["job_id"]
    access = [x for x in logs if x["message"] == "request"]
    assert access and access[-1]["status"] == 202 and access[-1]["correlation_id"] == job["job_id"]
    emf = []
    for raw in capsys.readouterr().out.splitlines():
        if raw.startswith('{"_aws"'):
            emf.append(_json.loads(raw))
    names = {m["Name"] for x in emf for d in x["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"JobsSubmitted", "Requests", "Latency"} <= names
