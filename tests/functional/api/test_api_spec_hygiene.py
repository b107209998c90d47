"""Submission refuses what a job could never run safely or at all, as problem+json naming the field, never a 500:
oversize specs and bodies (DynamoDB's item limit used to surface as 500), reserved env names, video sizes the
model cannot generate."""

from __future__ import annotations

import json

import pytest
from api_helpers import ALICE

from gpufleet.api.app import REQUEST_BODY_MAX_BYTES

TOOLS = "localhost/gpufleet-test/tools:1"


def submit(call, body, key="k-1"):
    return call("POST", "/v1/jobs", body, headers={"Idempotency-Key": key}, arn=ALICE)


def _container(**w) -> dict:
    return {"workload": {"kind": "container", "image": TOOLS, "command": ["true"], **w}}


@pytest.mark.parametrize("args", [120, 256])  # 480 KiB and 1 MiB: each argument within its own limit
def test_oversize_specs_are_4xx_problems_not_500(call, args):
    body = _container(command=["a" * 4096] * args)
    r = submit(call, body, key=f"big-{args}")
    assert r.status in (400, 413), r.text
    assert r.headers["content-type"] == "application/problem+json"
    if r.status == 413:
        assert r.json["type"].endswith("/payload-too-large") and r.json["field"] == "body"
    else:
        assert r.json["type"].endswith("/validation") and "workload.command" in r.json["detail"]


def test_a_spec_over_the_cap_but_under_the_body_limit_is_400_naming_the_largest_field(call):
    body = _container(command=["a" * 4096] * 20)  # 80 KiB
    assert len(json.dumps(body)) < REQUEST_BODY_MAX_BYTES
    r = submit(call, body)
    assert r.status == 400 and "spec_max_bytes" in r.json["detail"] and "workload.command" in r.json["detail"]


def test_a_body_over_the_limit_is_413_before_parsing(call):
    raw = b'{"workload": ' + b" " * REQUEST_BODY_MAX_BYTES + b"}"
    r = call("POST", "/v1/jobs", raw, headers={"Idempotency-Key": "ws"}, arn=ALICE)
    assert r.status == 413 and r.json["type"].endswith("/payload-too-large") and r.json["status"] == 413
    assert submit(call, _container(), key="ws").status == 202  # the key was not consumed


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "LD_PRELOAD", "PATH", "PYTHONPATH", "GPUFLEET_EPOCH"])
def test_reserved_env_names_are_400_naming_the_field(call, name):
    r = submit(call, _container(env={name: "x"}), key=name)
    assert r.status == 400 and r.json["type"].endswith("/validation"), r.text
    (err,) = r.json["errors"]
    assert err["field"] == "workload.container.env" and name in err["message"]


@pytest.mark.parametrize("frames", [129, 257])
def test_frames_the_model_cannot_generate_are_400(call, frames):
    r = submit(call, {"workload": {"kind": "video.generate", "prompt": "a fox", "frames": frames}}, key=str(frames))
    assert r.status == 400, r.text
    assert r.json["errors"][0]["field"] == "workload.video.generate.frames"
