"""The model catalog routes on moto (``/v1/admin/models``): the server registers the published manifest's hash
itself, a model only on nodes' local roots with the hash it is given; each change a conditional write with its audit
record; bad input a problem, never a 5xx. The entry is the item submission reads (``MODEL#<name>`` / ``MODEL``,
``content_hash``)."""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from adminapi_helpers import ALICE, OPERATOR, REGION
from fast_moto import fast_mock_aws

from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
from gpufleet.clock import FakeClock
from gpufleet.devstack.gateway import build_event
from gpufleet.models.loader import folder_sha256, publish_model
from gpufleet.store.objectstore import ObjectStore
from gpufleet.store.principals import put_principal
from gpufleet.store.schema import create_tables
from gpufleet.tables import DIR_MODELS, MODEL_SK, TableNames, model_pk

BUCKET = "ops-models"
ROOT = f"s3://{BUCKET}/models/"
OTHER = "ab" * 32


@pytest.fixture
def cat(tmp_path):
    with fast_mock_aws():
        ddb = boto3.client("dynamodb", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        names = TableNames()
        create_tables(ddb, names)
        put_principal(ddb, names.control, OPERATOR, "ops", "platform", "op", admin=True)
        put_principal(ddb, names.control, ALICE, "t1", "vision", "alice")
        api = build_admin_api(AdminApiSettings(control_table=names.control, model_s3_root=ROOT), dynamodb=ddb,
                              clock=FakeClock(1_780_000_000.0), s3=s3)
        folder = tmp_path / "wan-small"
        (folder / "transformer").mkdir(parents=True)
        (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
        (folder / "transformer" / "weights.safetensors").write_bytes(bytes(range(256)) * 8)
        yield {"ddb": ddb, "s3": s3, "api": api, "tables": names, "folder": folder}


def call(cat, method, path, body=None, *, who=OPERATOR):
    raw = b"" if body is None else json.dumps(body).encode()
    resp = cat["api"].handle(build_event(method, path, {"Content-Type": "application/json"}, raw, user_arn=who))
    return resp["statusCode"], json.loads(resp["body"] or "null")


def _item(cat, name):
    got = cat["ddb"].get_item(TableName=cat["tables"].control,
                              Key={"pk": {"S": model_pk(name)}, "sk": {"S": MODEL_SK}}).get("Item")
    return got


def _audit(cat):
    return [(r["action"], r["target"]) for r in call(cat, "GET", "/v1/admin/audit?month=2026-05")[1]["items"]]


def test_a_published_model_is_registered_with_its_manifests_hash_and_submission_reads_it(cat):
    digest = publish_model(cat["folder"], ObjectStore(cat["s3"]), ROOT, "wan-small")
    status, entry = call(cat, "PUT", "/v1/admin/models/wan-small", {})
    assert status == 200, entry
    assert (entry["name"], entry["content_hash"], entry["files"], entry["source"], entry["version"]) == (
        "wan-small", digest, 2, "published", 1)
    assert entry["created_by"] == entry["updated_by"] == OPERATOR
    # the item submission reads (pk/sk/content_hash), on the directory partition the listing queries
    item = _item(cat, "wan-small")
    assert item["content_hash"] == {"S": digest} and item["gsi2pk"] == {"S": DIR_MODELS}
    assert digest == folder_sha256(cat["folder"])
    # the body may name the hash: the same one is accepted and changes nothing (no second audit record)
    status, again = call(cat, "PUT", "/v1/admin/models/wan-small", {"content_hash": digest})
    assert status == 200 and again["version"] == 1
    assert call(cat, "GET", "/v1/admin/models")[1]["items"] == [entry]
    assert call(cat, "GET", "/v1/admin/models/wan-small")[1] == entry
    assert _audit(cat) == [("model.register", "model wan-small")]


def test_a_hash_that_is_not_the_published_manifests_is_a_409_naming_both(cat):
    digest = publish_model(cat["folder"], ObjectStore(cat["s3"]), ROOT, "wan-small")
    status, p = call(cat, "PUT", "/v1/admin/models/wan-small", {"content_hash": OTHER})
    assert status == 409 and p["type"].endswith("/conflict") and digest in p["detail"] and OTHER in p["detail"], p
    assert _item(cat, "wan-small") is None and _audit(cat) == []


def test_a_model_only_on_local_roots_needs_its_hash_and_a_new_hash_replaces_it_audited(cat):
    status, p = call(cat, "PUT", "/v1/admin/models/lab-model", {})
    assert status == 404 and "not published under " + ROOT in p["detail"] and "content_hash" in p["detail"], p
    local = folder_sha256(cat["folder"])
    status, entry = call(cat, "PUT", "/v1/admin/models/lab-model", {"content_hash": local})
    assert status == 200 and (entry["content_hash"], entry["source"], entry["version"]) == (local, "local", 1)
    status, entry = call(cat, "PUT", "/v1/admin/models/lab-model", {"content_hash": OTHER})
    assert status == 200 and (entry["content_hash"], entry["version"]) == (OTHER, 2)
    # an operator who read version 1 loses to the change made since
    status, p = call(cat, "PUT", "/v1/admin/models/lab-model", {"content_hash": local, "expected_version": 1})
    assert status == 409 and p["current_version"] == 2
    records = call(cat, "GET", "/v1/admin/audit?month=2026-05")[1]["items"]
    assert [(r["action"], r["detail"]["content_hash"], r["detail"]["previous_hash"]) for r in records] == [
        ("model.register", OTHER, local), ("model.register", local, None)]


def test_deregistering_removes_the_entry_audited_and_an_unknown_model_is_a_404(cat):
    call(cat, "PUT", "/v1/admin/models/lab-model", {"content_hash": OTHER})
    status, gone = call(cat, "DELETE", "/v1/admin/models/lab-model")
    assert status == 200 and gone["content_hash"] == OTHER
    assert _item(cat, "lab-model") is None
    assert call(cat, "GET", "/v1/admin/models/lab-model")[0] == 404
    assert call(cat, "DELETE", "/v1/admin/models/lab-model")[0] == 404
    assert call(cat, "GET", "/v1/admin/models")[1] == {"items": []}
    assert _audit(cat) == [("model.deregister", "model lab-model"), ("model.register", "model lab-model")]


@pytest.mark.parametrize("path, body, status, text", [
    ("/v1/admin/models/wan-tiny", {"content_hash": OTHER}, 400, "built in"),
    ("/v1/admin/models/.hidden", {"content_hash": OTHER}, 400, "cannot name a model"),
    ("/v1/admin/models/m", {"content_hash": "ABC"}, 400, ""),
    ("/v1/admin/models/m", {"content_hash": OTHER.upper()}, 400, ""),
    ("/v1/admin/models/m", {"content_hash": OTHER, "files": 3}, 400, ""),
    ("/v1/admin/models/" + "m" * 257, {"content_hash": OTHER}, 400, ""),
], ids=["built-in", "dot-name", "short-hash", "upper-hash", "unknown-field", "long-name"])
def test_bad_input_is_a_400_problem_and_writes_nothing(cat, path, body, status, text):
    got, p = call(cat, "PUT", path, body)
    assert got == status and p["type"].endswith("/validation") and text in p["detail"], p
    assert call(cat, "GET", "/v1/admin/models")[1] == {"items": []} and _audit(cat) == []


def test_a_published_manifest_that_is_not_one_is_a_409_not_a_5xx(cat):
    cat["s3"].put_object(Bucket=BUCKET, Key="models/broken/manifest.json", Body=b"not json")
    status, p = call(cat, "PUT", "/v1/admin/models/broken", {})
    assert status == 409 and "not a model manifest" in p["detail"], p
    raw = json.dumps({"files": {"a.bin": "x"}}).encode()
    cat["s3"].put_object(Bucket=BUCKET, Key="models/broken/manifest.json", Body=raw)
    assert call(cat, "PUT", "/v1/admin/models/broken", {"content_hash": hashlib.sha256(raw).hexdigest()})[0] == 409


def test_only_operators_see_or_change_the_catalog(cat):
    for method, path, body in (("GET", "/v1/admin/models", None), ("GET", "/v1/admin/models/m", None),
                               ("PUT", "/v1/admin/models/m", {"content_hash": OTHER}),
                               ("DELETE", "/v1/admin/models/m", None)):
        assert call(cat, method, path, body, who=ALICE)[0] == 403
    assert _item(cat, "m") is None


def test_without_a_models_root_every_registration_names_its_hash(cat):
    api = build_admin_api(AdminApiSettings(control_table=cat["tables"].control), dynamodb=cat["ddb"],
                          clock=FakeClock(1_780_000_000.0))
    publish_model(cat["folder"], ObjectStore(cat["s3"]), ROOT, "wan-small")
    resp = api.handle(build_event("PUT", "/v1/admin/models/wan-small", {"Content-Type": "application/json"}, b"{}",
                                  user_arn=OPERATOR))
    assert resp["statusCode"] == 404 and "none is configured" in json.loads(resp["body"])["detail"]
