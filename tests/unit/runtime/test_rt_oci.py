"""The tenant container's podman invocation (pure): every isolation flag, exactly the job's mounts, the env given
and nothing else; per-job uids; cgroup-driven runtime detection; no podman as root."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.runtime import oci


def _spec(**kw) -> oci.ContainerSpec:
    base = dict(name="gpufleet-job_1-e0002", image="localhost/t/tools:1", command=["python3", "-c", "print(1)"],
                env={"A": "1", "GPUFLEET_JOB_ID": "job_1"}, uid=12345,
                mounts=[oci.Mount(Path("/j/in"), oci.INPUT_DIR, False), oci.Mount(Path("/j/out"), oci.OUTPUT_DIR, True),
                        oci.Mount(Path("/j/ck"), "/ckpt", True)])
    return oci.ContainerSpec(**{**base, **kw})


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_isolation_flags():
    argv = oci.run_argv(_spec())
    head = argv[:argv.index("--")]
    for flag in ("--rm", "--init", "--read-only", "--read-only-tmpfs=false", "--http-proxy=false", "--no-hosts",
                 "--sig-proxy=false"):
        assert flag in head, flag
    assert _pairs(head, "--pull") == ["never"] and _pairs(head, "--user") == ["12345:12345"]
    assert _pairs(head, "--cap-drop") == ["all"] and _pairs(head, "--security-opt") == ["no-new-privileges"]
    assert _pairs(head, "--network") == ["none"]
    for ns in ("--pid", "--ipc", "--uts", "--cgroupns"):
        assert _pairs(head, ns) == ["private"], ns
    assert not {"--privileged", "--env-host", "--env-file", "--cap-add", "--device", "--userns=host"} & set(head)
    assert not [a for a in head if a.startswith(("--pid=host", "--network=host", "--security-opt=seccomp"))]
    assert argv[argv.index("--") + 1:] == ["localhost/t/tools:1", "python3", "-c", "print(1)"]


def test_exactly_the_job_directory_is_mounted_and_the_env_is_what_was_given():
    head = oci.run_argv(_spec())
    assert _pairs(head, "--volume") == ["/j/in:/job/inputs:ro", "/j/out:/job/output:rw,U", "/j/ck:/ckpt:rw,U"]
    tmpfs = _pairs(head, "--tmpfs")
    assert [t.split(":")[0] for t in tmpfs] == ["/job/scratch", "/tmp"]
    assert all("nosuid" in t and "nodev" in t for t in tmpfs)
    assert _pairs(head, "--env") == ["A=1", "GPUFLEET_JOB_ID=job_1"]
    assert _pairs(head, "--ulimit") == ["nofile=1024:1024", "nproc=1024:1024", "core=0:0"]


def test_gpus_are_cdi_devices_and_egress_is_a_setting():
    head = oci.run_argv(_spec(gpus=["0", "3"], network="slirp4netns"))
    assert _pairs(head, "--device") == ["nvidia.com/gpu=0", "nvidia.com/gpu=3"]
    assert _pairs(head, "--network") == ["slirp4netns"]


def test_job_uids_are_stable_and_within_the_subordinate_range():
    uids = {oci.job_uid(f"job_{i}", 10000, 50000) for i in range(200)}
    assert all(10000 <= u < 60000 for u in uids) and len(uids) > 190
    assert oci.job_uid("job_x", 10000, 50000) == oci.job_uid("job_x", 10000, 50000)
    assert oci.container_name("job_x", 3) == "gpufleet-job_x-e0003"


def test_runtime_detection_follows_the_cgroup_layout(monkeypatch):
    monkeypatch.setattr(oci, "cgroup_unified", lambda: False)
    assert oci.detect_oci_runtime() == "runc" and oci.detect_cgroup_manager() == "cgroupfs"  # v1/hybrid: crun refuses
    monkeypatch.setattr(oci, "cgroup_unified", lambda: True)
    monkeypatch.setattr(oci.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert oci.detect_oci_runtime() == "crun"
    assert oci.detect_oci_runtime("runc") == "runc" and oci.detect_cgroup_manager("systemd") == "systemd"


def test_host_ulimits_cap_the_request():
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert oci.host_ulimit(resource.RLIMIT_NOFILE, 1 << 40) == (1 << 40 if hard == resource.RLIM_INFINITY else hard)
    assert oci.host_ulimit(resource.RLIMIT_NOFILE, 64) == 64


def test_root_never_runs_podman_itself(monkeypatch):
    monkeypatch.setattr(oci.os, "geteuid", lambda: 0)
    with pytest.raises(ConfigError, match="GPUFLEET_OCI_USER"):
        oci.Podman()
    with pytest.raises(ConfigError, match="does not exist"):
        oci.Podman(user="no-such-user-gpufleet")
    with pytest.raises(ConfigError, match="must not be root"):
        oci.Podman(user="root")


def test_podman_errors_name_the_error_not_the_warnings_before_it():
    from gpufleet.runtime.oci import stderr_reason

    warn = 'time="x" level=warning msg="\\"/\\" is not a shared mount, this could cause issues"\n'
    got = stderr_reason((warn * 20 + "Error: cannot set up namespace using newuidmap: exit status 1\n").encode())
    assert got == "Error: cannot set up namespace using newuidmap: exit status 1"
    assert stderr_reason((warn * 3).encode()) == "(podman printed only warnings)"
    long = stderr_reason(("a" * 2000 + "\nError: the end\n").encode(), limit=100)
    assert long.endswith("Error: the end") and len(long) <= 101


def test_the_container_gets_exactly_the_gpus_the_agent_placed(monkeypatch):
    from gpufleet.runtime import container

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    argv = oci.run_argv(_spec(gpus=container._gpus()))
    assert _pairs(argv[: argv.index("--")], "--device") == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU-only node: no devices at all
    assert container._gpus() == []
