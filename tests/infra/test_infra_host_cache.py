"""The GPU instances' host cache in the synthesized template: prepared by the GPU launch template's user data,
mounted into the platform's GPU definitions only, bounded by the runtime; and the user data's script, run."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from gpufleet.batchdef import job_definition
from gpufleet.local.synth import synthesize, template
from infra.compute import HOST_CACHE, HOST_CACHE_SCRIPT, RUNTIME_CACHE_DIR, RUNTIME_UID
from infra.config import CONTEXT_PREFIX

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("cdk-synth")  # one synth of another context: beside the template tests' own


def _of_type(tpl: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in tpl["Resources"].items() if v["Type"] == kind}


def _user_data(lt: dict) -> tuple[str, str] | None:
    """A launch template's user data as (MIME header, shell part's script), or None."""
    raw = lt["Properties"]["LaunchTemplateData"].get("UserData")
    if raw is None:
        return None
    header, part, tail = raw["Fn::Base64"]["Fn::Join"][1]  # CloudFormation base64-encodes the part itself
    assert tail.strip() == "--+AWS+CDK+User+Data+Separator==--"
    return header, part["Fn::Base64"]


def _gpu_script(tpl: dict) -> str:
    (data,) = [d for d in map(_user_data, _of_type(tpl, "AWS::EC2::LaunchTemplate").values()) if d]
    return data[1]


def test_gpu_environments_prepare_the_host_cache_and_the_cpu_one_does_not(tpl):
    templates = _of_type(tpl, "AWS::EC2::LaunchTemplate")
    envs = _of_type(tpl, "AWS::Batch::ComputeEnvironment")
    by_env = {name: env["Properties"]["ComputeResources"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
              for name, env in envs.items()}
    gpu = {n for n in by_env if n.startswith(("ComputeGpuSpot", "ComputeGpuOnDemand", "ComputeGpuGang"))}
    assert len(gpu) == 3 and len(envs) == 4
    (gpu_lt,) = {by_env[n] for n in gpu}
    (cpu_lt,) = {by_env[n] for n in set(envs) - gpu}
    assert gpu_lt != cpu_lt and _user_data(templates[cpu_lt]) is None
    header, script = _user_data(templates[gpu_lt])
    assert header.startswith("Content-Type: multipart/mixed")  # what Batch accepts in a launch template
    assert 'Content-Type: text/x-shellscript; charset="utf-8"' in header
    assert script == "#!/bin/bash\n" + HOST_CACHE_SCRIPT.rstrip("\n")


def test_the_platforms_gpu_definitions_mount_it_and_bound_it_and_nothing_else_does(tpl):
    defs = _of_type(tpl, "AWS::Batch::JobDefinition")
    mounted = {}
    for name, d in defs.items():
        props = d["Properties"]
        containers = ([props["ContainerProperties"]] if "ContainerProperties" in props else
                      [r["Container"] for r in props.get("NodeProperties", {}).get("NodeRangeProperties", [])])
        for c in containers:
            vols = {v["Name"]: v for v in c.get("Volumes", [])}
            env = {e["Name"]: e["Value"] for e in c.get("Environment", [])}
            if "host-cache" in vols:
                assert vols["host-cache"]["Host"]["SourcePath"] == HOST_CACHE
                (mp,) = [m for m in c["MountPoints"] if m["SourceVolume"] == "host-cache"]
                assert mp["ContainerPath"] == RUNTIME_CACHE_DIR and not mp.get("ReadOnly", False)
                assert env["GPUFLEET_CACHE_DIR"] == RUNTIME_CACHE_DIR
                assert int(env["GPUFLEET_CACHE_MAX_BYTES"]) == 150 * 2**30  # gpu_host_cache_gib's default
                mounted[name] = c["JobRoleArn"]
            else:
                assert "GPUFLEET_CACHE_MAX_BYTES" not in env, name
    assert len(mounted) == 2  # the single-GPU definition and the gang's; never the CPU (finalize) definition
    # tenant containers' per-image definitions (registered at dispatch) mount no host path at all
    tenant = job_definition(prefix="gf", image="123456789012.dkr.ecr.us-east-1.amazonaws.com/x@sha256:" + "a" * 64,
                            supervisor_image="sup:1", execution_role_arn="arn:aws:iam::123456789012:role/exec",
                            log_group="logs", region="us-east-1", timeout_s=600)
    assert "host" not in repr(tenant["ecsProperties"]).lower() and HOST_CACHE not in repr(tenant)


def test_the_image_finds_the_cache_where_it_is_mounted_as_the_user_it_belongs_to():
    dockerfile = (ROOT / "gpu_container" / "Dockerfile").read_text()
    assert re.search(rf"GPUFLEET_CACHE_DIR={re.escape(RUNTIME_CACHE_DIR)}\b", dockerfile)
    assert re.search(rf"useradd [^\n]*--uid {RUNTIME_UID} ", dockerfile)


def _min_vcpus(t: dict) -> dict[str, int]:
    return {n: e["Properties"]["ComputeResources"]["MinvCpus"]
            for n, e in _of_type(t, "AWS::Batch::ComputeEnvironment").items()}


def test_a_deployment_without_a_host_cache_has_neither_user_data_nor_mounts_and_may_keep_warm_instances(tpl):
    assert set(_min_vcpus(tpl).values()) == {0}  # by default every environment scales to nothing when idle
    other = template(synthesize({f"{CONTEXT_PREFIX}gpu_host_cache_gib": 0, f"{CONTEXT_PREFIX}ondemand_min_vcpus": 8}))
    assert not [lt for lt in _of_type(other, "AWS::EC2::LaunchTemplate").values() if _user_data(lt)]
    assert "host-cache" not in repr(_of_type(other, "AWS::Batch::JobDefinition"))
    warm = {n: v for n, v in _min_vcpus(other).items() if v}
    assert len(warm) == 1 and next(iter(warm)).startswith("ComputeGpuOnDemand") and set(warm.values()) == {8}


def test_the_user_data_script_prepares_the_cache_on_the_root_volume(tpl, tmp_path):
    """The template's own script, its two paths moved under a temporary folder (no instance store here); run as root
    it gives the cache to the image's user, otherwise (chown to another user needs root) to the user running it."""
    base, cache = tmp_path / "gpufleet", tmp_path / "gpufleet" / "cache"
    script = _gpu_script(tpl).replace("base=/var/lib/gpufleet\n", f"base={base}\n", 1)
    script = script.replace(f"cache={HOST_CACHE}\n", f"cache={cache}\n", 1)
    owner, group = (RUNTIME_UID, RUNTIME_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    if owner != RUNTIME_UID:
        script = script.replace(f"uid={RUNTIME_UID}\n", f"uid={owner}\n", 1)
        script = script.replace('chown "$uid:$uid"', f'chown "$uid:{group}"', 1)
    assert script.count(str(tmp_path)) == 2 and f"uid={owner}\n" in script
    for _ in range(2):  # a reboot runs it again
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        st = cache.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == owner and st.st_gid == group

