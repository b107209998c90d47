"""``POST /v1/provenance/lookup`` on moto: the platform detects its keyed watermark in a questioned
video's mean luma and returns the kept manifests of the jobs whose payload it carries."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from api_helpers import ALICE, CAROL, VIDEO

from gpufleet.provenance import robustness, watermark
from gpufleet.provenance.watermark import WatermarkKey
from gpufleet.status import JobStatus as S
from gpufleet.store import jobs as job_store
from gpufleet.store.provenance import DynamoProvenanceIndex, ProvenanceEntry

KEY = WatermarkKey(b"\x42" * 32)


@pytest.fixture
def settings_kw(tmp_path):
    path = tmp_path / "watermark.keys"
    path.write_text(KEY.secret.hex() + "\n")
    return {"watermark_keys_file": str(path)}


def _published(call, deps, arn: str | None = None, payload: str | None = None) -> str:
    """A SUCCEEDED job of ``arn``'s (alice's by default) indexed under its payload (or ``payload``: a collision)."""
    jid = call("POST", "/v1/jobs", VIDEO, headers={"Idempotency-Key": "p1"}, **({"arn": arn} if arn else {}))
    jid = jid.json["job_id"]
    t = deps.settings.jobs_table
    for a, b in ((S.QUEUED, S.PENDING), (S.PENDING, S.SCHEDULED), (S.SCHEDULED, S.RUNNING), (S.RUNNING, S.FINALIZING)):
        job_store.transition(deps.ddb, t, jid, [a], b, clock=deps.clock)
    out = {"video_key": f"jobs/{jid}/video.mp4", "manifest_key": f"jobs/{jid}/video.c2pa",
           "watermark_payload": payload or watermark.payload_hex(jid), "watermark_key_id": KEY.key_id}
    DynamoProvenanceIndex(deps.ddb, t).record(ProvenanceEntry(
        payload=out["watermark_payload"], job_id=jid, key_id=KEY.key_id, video_key=out["video_key"],
        manifest_key=out["manifest_key"], video_sha256="ab" * 32, published_at="2026-12-02T00:00:00Z"))
    job_store.transition(deps.ddb, t, jid, [S.FINALIZING], S.SUCCEEDED, {"output": out}, clock=deps.clock)
    return jid


def _body(frames: np.ndarray) -> dict:
    luma = watermark.mean_luma(frames)
    return {"width": luma.shape[1], "height": luma.shape[0], "luma_b64": base64.b64encode(luma.tobytes()).decode()}


def test_a_stripped_reencoded_copy_finds_its_job_and_manifest(call, deps):
    jid = _published(call, deps)
    clip = robustness.generated_clip(6, 256)
    copy = robustness.scale(robustness.reencode(watermark.embed(clip, watermark.payload_for_job(jid), KEY)), 0.5)
    r = call("POST", "/v1/provenance/lookup", _body(copy))
    assert r.status == 200, r.json
    assert r.json["found"] is True and r.json["watermark_payload"] == watermark.payload_hex(jid)
    assert r.json["watermark_key_id"] == KEY.key_id
    [match] = r.json["matches"]
    assert match["job_id"] == jid and match["own"] is True and match["video_sha256"] == "ab" * 32
    assert "video.c2pa" in match["manifest_url"] and "video.mp4" in match["video_url"]
    # Another tenant learns the manifest the video carried, never a link to the tenant's original.
    other = call("POST", "/v1/provenance/lookup", _body(copy), arn=CAROL).json["matches"]
    assert other[0]["job_id"] == jid and other[0]["own"] is False and other[0]["video_url"] is None


def test_a_payload_collision_shows_a_tenant_checking_its_own_video_only_its_own_job(call, deps):
    """Two tenants' jobs indexed under one 48-bit payload (a collision, forced here): each tenant checking the video
    sees its own job alone; a tenant with neither job sees both manifests (as ambiguous as the mark), no original."""
    from gpufleet.store.principals import put_principal

    alice_job = _published(call, deps)
    carol_job = _published(call, deps, arn=CAROL, payload=watermark.payload_hex(alice_job))
    clip = watermark.embed(robustness.generated_clip(6, 256), watermark.payload_for_job(alice_job), KEY)
    for arn, own in ((ALICE, alice_job), (CAROL, carol_job)):
        [match] = call("POST", "/v1/provenance/lookup", _body(clip), arn=arn).json["matches"]
        assert match["job_id"] == own and match["own"] is True, arn
    dave = ALICE.replace("alice", "dave")
    put_principal(deps.ddb, deps.settings.control_table, dave, "t3", "ops", "dave")
    both = call("POST", "/v1/provenance/lookup", _body(clip), arn=dave).json["matches"]
    assert sorted(m["job_id"] for m in both) == sorted([alice_job, carol_job])
    assert all(m["own"] is False and m["video_url"] is None for m in both)


def test_unmarked_or_foreign_marked_video_finds_nothing(call, deps):
    jid = _published(call, deps)
    clip = robustness.generated_clip(4, 256)
    forged = watermark.embed(clip, watermark.payload_for_job(jid), WatermarkKey(b"\x01" * 32))
    for frames in (clip, forged):
        r = call("POST", "/v1/provenance/lookup", _body(frames))
        assert r.status == 200 and r.json["found"] is False and r.json["matches"] == []


def test_a_mark_of_an_unpublished_job_lists_no_match(call, deps):
    clip = robustness.generated_clip(4, 256)
    r = call("POST", "/v1/provenance/lookup", _body(watermark.embed(clip, watermark.payload_for_job("job_x"), KEY)))
    assert r.status == 200 and r.json["found"] is True and r.json["matches"] == []


def test_bad_uploads_are_4xx(call):
    ok = _body(robustness.generated_clip(1, 64))
    assert call("POST", "/v1/provenance/lookup", {**ok, "luma_b64": "%%%"}).status == 400
    assert call("POST", "/v1/provenance/lookup", {**ok, "width": 65}).status == 400
    assert call("POST", "/v1/provenance/lookup", {**ok, "extra": 1}).status == 400
    big = {"width": 2048, "height": 2048, "luma_b64": "A" * (2048 * 2048 * 4 // 3)}
    assert call("POST", "/v1/provenance/lookup", big).status == 413


def test_without_watermark_keys_the_lookup_is_not_configured(call, deps):
    deps.watermark_keys = ()
    r = call("POST", "/v1/provenance/lookup", _body(robustness.generated_clip(1, 64)))
    assert r.status == 409 and "not configured" in r.json["detail"]


def test_a_deployed_api_reads_the_watermark_secret_on_the_first_lookup_and_a_bad_one_is_a_409(call, deps):
    """The deployed wiring (gpufleet.api.wiring): the keys come from the template's watermark secret, read once
    when first needed; an unreadable or placeholder secret leaves the lookup a 409, every other route works."""
    import json

    import boto3

    from gpufleet.api.wiring import watermark_secret_source

    jid = _published(call, deps)
    marked = _body(watermark.embed(robustness.generated_clip(4, 256), watermark.payload_for_job(jid), KEY))
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="gpufleet-watermark", SecretString="not json")["ARN"]
    deps.watermark_keys, deps.watermark_keys_source = (), watermark_secret_source(sm, arn)
    r = call("POST", "/v1/provenance/lookup", marked)
    assert r.status == 409 and "unreadable" in r.json["detail"] and arn not in r.json["detail"]
    assert call("GET", f"/v1/jobs/{jid}").status == 200  # the rest of the API is untouched
    sm.put_secret_value(SecretId=arn, SecretString=json.dumps({"keys_hex": [KEY.secret.hex()], "seed": "s" * 64}))
    r = call("POST", "/v1/provenance/lookup", marked)
    assert r.status == 200 and r.json["found"] is True and r.json["watermark_key_id"] == KEY.key_id
    assert [m["job_id"] for m in r.json["matches"]] == [jid]


def test_the_index_is_written_once_per_video(deps):
    index = DynamoProvenanceIndex(deps.ddb, deps.settings.jobs_table)
    e = ProvenanceEntry(payload="0123456789ab", job_id="job_a", key_id="k", video_key="jobs/job_a/video.mp4",
                        manifest_key="jobs/job_a/video.c2pa", video_sha256=None, published_at="2026-12-02T00:00:01Z")
    index.record(e)
    index.record(e)  # a retried Publish
    from gpufleet.errors import Conflict

    with pytest.raises(Conflict):
        index.record(ProvenanceEntry(**{**e.__dict__, "video_key": "jobs/job_a/other.mp4"}))
    index.record(ProvenanceEntry(**{**e.__dict__, "job_id": "job_b", "published_at": "2026-12-02T00:00:00Z"}))
    assert [x.job_id for x in index.lookup("0123456789ab")] == ["job_b", "job_a"]
    assert index.lookup("ffffffffffff") == []


def test_the_lookups_own_function_serves_that_route_alone_with_its_own_keys(call, deps, monkeypatch):
    """``lambdas/api/lookup.py`` (API Gateway's integration for the route, infra/api.py): built from the deployed
    environment with the watermark secret, no cursor secret; it finds the job, and any other route — one the API
    function serves — is a 404 before anything is read. The API function without keys answers the route 409."""
    import json

    import boto3
    from api_helpers import Caller

    from lambdas.api import lookup

    jid = _published(call, deps)
    marked = _body(watermark.embed(robustness.generated_clip(4, 256), watermark.payload_for_job(jid), KEY))
    deps.watermark_keys = ()
    assert call("POST", "/v1/provenance/lookup", marked).status == 409  # the API function holds no key
    arn = boto3.client("secretsmanager").create_secret(
        Name="gpufleet-watermark-lookup", SecretString=json.dumps({"keys_hex": [KEY.secret.hex()], "seed": "s" * 64}))
    for name, value in (("GPUFLEET_WATERMARK_SECRET_ARN", arn["ARN"]), ("GPUFLEET_JOBS_TABLE", deps.settings.jobs_table),
                        ("GPUFLEET_CONTROL_TABLE", deps.settings.control_table),
                        ("GPUFLEET_OUTPUTS_BUCKET", deps.settings.outputs_bucket),
                        ("GPUFLEET_CURSOR_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:unreadable")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUFLEET_CURSOR_SECRET", raising=False)
    monkeypatch.setattr(lookup, "_api", None)
    own = Caller(type("LookupFunction", (), {"handle": staticmethod(lookup.handler)})())
    r = own("POST", "/v1/provenance/lookup", marked)
    assert r.status == 200 and [m["job_id"] for m in r.json["matches"]] == [jid], r.json
    for method, path in (("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{jid}"), ("DELETE", f"/v1/jobs/{jid}"),
                         ("POST", "/v1/jobs"), ("GET", "/v1/webhooks/secrets")):
        got = own(method, path, VIDEO if method == "POST" else None)
        assert got.status == 404 and got.json["type"].endswith("not-found"), (method, path, got.json)
    assert deps.jobs.get(jid)["status"] == S.SUCCEEDED.value  # the refused DELETE cancelled nothing
