"""Admission at submission: an image outside the site allowlist and inputs that are not the tenant's own are
403 ``not-allowed`` problems naming the field; a tag-only image for a job allowed only cloud pools is a 400 naming
``workload.image``; nothing is stored and the Idempotency-Key is not consumed."""

from __future__ import annotations

import pytest
from api_helpers import ALICE, CAROL

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def settings_kw():
    return {"image_allowlist": ["localhost/", "registry.example.com/ml", DIGEST],
            "input_buckets": ["gf-data"], "tenant_buckets": {"t2": ["carol-lab"]}}


def submit(call, body, key="k-1", arn=ALICE):
    return call("POST", "/v1/jobs", body, headers={"Idempotency-Key": key}, arn=arn)


def _container(image="localhost/gpufleet-test/tools:1", inputs=()) -> dict:
    return {"workload": {"kind": "container", "image": image, "command": ["true"]}, "data": {"inputs": list(inputs)}}


REFUSED_IMAGES = ["alpine:3.20", "docker.io/library/python:3.11", "registry.example.com/ml-x/a:1",
                  "evil.example/localhost/a:1", "localhost:5000/a:1", "ubuntu@sha256:" + "cd" * 32]
ALLOWED_IMAGES = ["localhost/gpufleet-test/tools:1", "registry.example.com/ml/train:2", "registry.example.com/ml",
                  "ubuntu@" + DIGEST]
NOT_OWNED = [
    "s3://gpufleet-outputs/tenants/t2/data.bin",  # another tenant's prefix
    "s3://gpufleet-outputs/jobs/job_x/output/result.json",  # another job's output
    "s3://gpufleet-outputs/tenants/t1x/a.bin",  # not a path-boundary match
    "s3://gpufleet-outputs/tenants/t1/../t2/a.bin",  # dot segments
    "s3://gpufleet-outputs/tenants/t1//a.bin",
    "s3://carol-lab/data.bin",  # registered to t2, not t1
    "s3://somebody-elses-bucket/tenants/t1/a.bin",  # not a platform data bucket
]


def test_an_image_outside_the_allowlist_is_403_naming_workload_image(call):
    for image in REFUSED_IMAGES:
        r = submit(call, _container(image), key=image)
        assert r.status == 403, (image, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json["type"].endswith("/not-allowed") and r.json["field"] == "workload.image"
        assert image in r.json["detail"]
    assert submit(call, _container(), key=REFUSED_IMAGES[0]).status == 202  # the key was not consumed
    for image in ALLOWED_IMAGES:
        assert submit(call, _container(image), key=f"ok-{image}").status == 202, image


def test_a_tag_only_image_allowed_only_cloud_pools_is_400_naming_workload_image(call):
    body = {**_container(), "pools": ["cloud-spot", "cloud-ondemand"]}
    r = submit(call, body, key="tag-cloud")
    assert r.status == 400 and r.json["field"] == "workload.image", r.text
    assert "by tag only" in r.json["detail"] and "cloud-spot" in r.json["detail"]
    pinned = {**body, "workload": {**body["workload"], "image": "localhost/gpufleet-test/tools@" + DIGEST}}
    assert submit(call, pinned, key="tag-cloud").status == 202  # the key was not consumed; a digest may burst
    # an on-prem pool among the allowed ones: accepted (the scheduler keeps it off the cloud pools)
    mixed = {**body, "pools": ["onprem-a", "cloud-spot"]}
    assert submit(call, mixed, key="tag-mixed").status == 202


def test_inputs_not_owned_by_the_tenant_are_403_naming_the_input(call):
    for uri in NOT_OWNED:
        r = submit(call, _container(inputs=["s3://gf-data/tenants/t1/ok.bin", uri]), key=uri)
        assert r.status == 403, (uri, r.text)
        assert r.json["type"].endswith("/not-allowed") and r.json["field"] == "data.inputs.1"


def test_the_tenants_own_inputs_are_accepted(call):
    mine = ["s3://gpufleet-outputs/tenants/t1/a.bin", "s3://gf-data/tenants/t1/sub/b.bin?versionId=3"]
    assert submit(call, _container(inputs=mine)).status == 202
    theirs = ["s3://carol-lab/any/key.bin", "s3://gf-data/tenants/t2/x"]
    assert submit(call, _container(inputs=theirs), key="carol", arn=CAROL).status == 202
    video = {"workload": {"kind": "video.generate", "prompt": "a fox"}, "data": {"inputs": ["s3://gf-data/x"]}}
    assert submit(call, video, key="video").status == 403  # the rule holds for every workload kind
