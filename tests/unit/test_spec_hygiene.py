"""JobSpec hygiene: env names are an allowlist pattern minus reserved names/prefixes, every string and list is
bounded, the serialized spec is capped, and video frames/sizes/steps are what the named model can generate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.models.limits import TINY_SIDE_MAX, frames_for_rope
from gpufleet.spec import LIMITS, RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES, JobSpec


def _container(**w) -> dict:
    return {"workload": {"kind": "container", "image": "localhost/gpufleet-test/tools:1", "command": ["true"], **w}}


def _video(**w) -> dict:
    return {"workload": {"kind": "video.generate", "prompt": "a fox", **w}}


def _errors(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "LD_PRELOAD", "LD_LIBRARY_PATH",
                                  "PYTHONPATH", "PYTHONSTARTUP", "GPUFLEET_JOB_ID", "PATH", "HOME", "USER", "SHELL",
                                  "HOSTNAME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"])
def test_reserved_env_names_are_refused_naming_the_field(name):
    (err,) = _errors(_container(env={name: "x"}))
    assert err[0] == "workload.container.env" and name in err[1] and "reserved" in err[1]


@pytest.mark.parametrize("name", ["lower", "_UNDERSCORE", "1ST", "A-B", "A.B", "Ä", "X" * 129, ""])
def test_env_names_outside_the_pattern_are_refused(name):
    (err,) = _errors(_container(env={name: "x"}))
    assert err[0] == "workload.container.env" and "[A-Z][A-Z0-9_]*" in err[1]


def test_ordinary_env_names_pass():
    spec = JobSpec.model_validate(_container(env={"TOTAL": "3", "BATCH_SIZE": "8", "CUDA_LAUNCH_BLOCKING": "1",
                                                  "HF_HOME": "/job/scratch", "X" * 128: ""}))
    assert spec.workload.env["TOTAL"] == "3"
    assert {"PATH", "HOME", "CUDA_VISIBLE_DEVICES"} <= RESERVED_ENV_NAMES
    assert RESERVED_ENV_PREFIXES == ("AWS_", "LD_", "PYTHON", "GPUFLEET_")


def test_the_serialized_spec_is_capped_and_the_problem_names_the_largest_field():
    cap = int(LIMITS["spec_max_bytes"])
    # every argument and the count are within their own limits: only the total is too big (480 KiB, 1 MiB)
    for n in (120, 256):
        (err,) = _errors(_container(command=["a" * 4096] * n))
        assert f"at most {cap}" in err[1] and "largest field: workload.command" in err[1]
    (err,) = _errors(_container(env={f"V{i}": "v" * 4096 for i in range(40)}))
    assert "largest field: workload.env" in err[1]
    JobSpec.model_validate(_container(command=["a" * 4096] * 15))  # 60 KiB: fine


def test_every_list_and_string_is_bounded():
    long_uri = "s3://bucket-a/tenants/t1/" + "k" * 1024
    assert _errors({**_container(), "data": {"inputs": [long_uri]}})[0][0].startswith("data.inputs.0")
    assert _errors({**_container(), "data": {"residency": ["r" * 65]}})[0][0] == "data.residency.0"
    assert _errors({**_container(), "data": {"residency": ["eu"] * 17}})[0][0] == "data.residency"
    hook = {"url": "https://example.com/h", "events": ["completed"] * 4}
    assert _errors({**_container(), "webhook": hook})[0][0] == "webhook.events"
    assert _errors(_container(image="Not An Image"))[0][0] == "workload.container.image"


@pytest.mark.parametrize("path", ["relative", "/", "/proc/self", "/job/output", "/tmp/x", "/a/../etc", "/a:b",
                                  "/etc"])
def test_checkpoint_dir_must_be_a_private_absolute_path(path):
    assert _errors(_container(checkpoint_dir=path))[0][0] == "workload.container.checkpoint_dir"


def test_checkpoint_dir_is_normalized():
    assert JobSpec.model_validate(_container(checkpoint_dir="/ckpt/")).workload.checkpoint_dir == "/ckpt"


def test_video_limits_follow_the_model():
    most = frames_for_rope(32)
    assert most == 125
    JobSpec.model_validate(_video(frames=most))
    for frames in (129, 257):  # accepted before, crashed wan-tiny's rotary table on every attempt
        (err,) = _errors(_video(frames=frames))
        assert err[0] == "workload.video.generate.frames" and "at most 125 frames" in err[1]
    # a full-size Wan model has a 1024-row table: the API's own limit binds
    JobSpec.model_validate(_video(frames=int(LIMITS["frames_max"]), model="wan2.1-t2v-1.3b"))
    assert _errors(_video(frames=10))[0] == ("workload.video.generate.frames",
                                              "Value error, frames must be of the form 4k+1 (1, 5, 9, 13, ...)")
    assert _errors(_video(width=100))[0][0] == "workload.video.generate.width"
    assert _errors(_video(height=72))[0][0] == "workload.video.generate.height"
    assert TINY_SIDE_MAX == 512
