"""Submission and the model catalog: a generate job naming a registered model stores the content hash it runs
(``model_hash``, shown on the job); one naming a model outside the catalog is a 400 naming ``workload.model`` with
nothing stored and the Idempotency-Key not consumed (a job array too); built-in models and container jobs need no
entry (gpufleet.store.model_catalog)."""

from __future__ import annotations

from api_helpers import ALICE

from gpufleet import tables as keys

HASH = "ab" * 32


def _register(ddb, tables, name: str, digest: str = HASH) -> None:
    """What the administration API's registration leaves in the control table (its tests cover the route)."""
    ddb.put_item(TableName=tables.control, Item={"pk": {"S": keys.model_pk(name)}, "sk": {"S": keys.MODEL_SK},
                                                 "name": {"S": name}, "content_hash": {"S": digest},
                                                 "source": {"S": "published"}, "files": {"N": "4"},
                                                 "updated_by": {"S": "arn:aws:iam::1:user/operator"},
                                                 keys.DIRECTORY_ATTR: {"S": keys.DIR_MODELS}})


def _generate(model: str | None = None) -> dict:
    w = {"kind": "video.generate", "prompt": "a red fox in snow"}
    return {"workload": {**w, "model": model} if model else w}


def _jobs(ddb, tables) -> list[dict]:
    return [i for i in ddb.scan(TableName=tables.jobs)["Items"] if i["sk"]["S"] == "META"]


def test_a_registered_model_is_pinned_on_the_job(call, ddb, tables):
    _register(ddb, tables, "wan-1.3b")
    r = call("POST", "/v1/jobs", _generate("wan-1.3b"), headers={"Idempotency-Key": "k1"}, arn=ALICE)
    assert r.status == 202, r.text
    (item,) = _jobs(ddb, tables)
    assert item["model_hash"]["S"] == HASH
    assert call("GET", f"/v1/jobs/{r.json['job_id']}").json["model_hash"] == HASH
    # re-registering later does not change what the admitted job runs
    _register(ddb, tables, "wan-1.3b", "cd" * 32)
    assert call("GET", f"/v1/jobs/{r.json['job_id']}").json["model_hash"] == HASH


def test_a_model_outside_the_catalog_is_400_naming_workload_model_and_nothing_is_stored(call, ddb, tables):
    r = call("POST", "/v1/jobs", _generate("wan-14b"), headers={"Idempotency-Key": "k2"})
    assert r.status == 400 and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json["type"].endswith("/validation") and r.json["errors"][0]["field"] == "workload.model"
    assert "'wan-14b' is not in this deployment's model catalog" in r.json["detail"]
    assert _jobs(ddb, tables) == []
    _register(ddb, tables, "wan-14b")
    assert call("POST", "/v1/jobs", _generate("wan-14b"), headers={"Idempotency-Key": "k2"}).status == 202

    arr = {"count": 2, "spec": _generate("wan-unknown")}
    r = call("POST", "/v1/job-arrays", arr, headers={"Idempotency-Key": "k3"})
    assert r.status == 400 and r.json["errors"][0]["field"] == "workload.model", r.text
    assert len(_jobs(ddb, tables)) == 1


def test_built_in_models_need_no_entry_and_each_array_element_is_pinned(call, ddb, tables):
    assert call("POST", "/v1/jobs", _generate(), headers={"Idempotency-Key": "k4"}).status == 202
    assert call("POST", "/v1/jobs", _generate("wan-tiny"), headers={"Idempotency-Key": "k5"}).status == 202
    _register(ddb, tables, "wan-1.3b")
    r = call("POST", "/v1/job-arrays", {"count": 2, "spec": _generate("wan-1.3b")}, headers={"Idempotency-Key": "k6"})
    assert r.status == 202, r.text
    pinned = sorted(i.get("model_hash", {}).get("S", "-") for i in _jobs(ddb, tables))
    assert pinned == ["-", "-", HASH, HASH]


def test_a_tenant_lists_the_models_it_may_name(call, ddb, tables):
    """``GET /v1/models``: the built-in models, then the catalog by name, with the hash a job would be pinned to —
    never who registered an entry."""
    assert call("GET", "/v1/models").json["models"] == [
        {"name": "wan-tiny", "builtin": True, "content_hash": None, "source": None, "files": None}]
    _register(ddb, tables, "wan-14b", "cd" * 32)
    _register(ddb, tables, "wan-1.3b")
    got = call("GET", "/v1/models").json["models"]
    assert [m["name"] for m in got] == ["wan-tiny", "wan-1.3b", "wan-14b"]
    assert got[1] == {"name": "wan-1.3b", "builtin": False, "content_hash": HASH, "source": "published", "files": 4}
    assert "updated_by" not in str(got)
