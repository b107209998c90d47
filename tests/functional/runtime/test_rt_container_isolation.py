"""Escape tests: a probe job run by the REAL runtime container stage tries to reach what tenant code must never
reach, and fails. Each test runs the stage (podman, the tools image) with the probe below and reads the probe's
findings from the job's uploaded output.

The probe runs ``python3`` from the image. Under the stage that ran commands on the host (before tenant
containers) every probe below succeeded: the command ran as the runtime's user with its environment."""

from __future__ import annotations

import io
import json
import os
import threading
import time
import urllib.request

import psutil
import pytest

from gpufleet.envelope import ExitCode
from gpufleet.local.imds import LocalImds
from gpufleet.runtime.main import main
from gpufleet.runtime.settings import RuntimeSettings

TOOLS = "localhost/gpufleet-test/tools:1"

PROBE = r"""
import json, os, socket, sys
cfg = json.loads(sys.argv[1])
out = {}

def attempt(name, fn):
    try:
        out[name] = {"escaped": True, "detail": str(fn())[:300]}
    except Exception as e:  # a refusal is the expected outcome
        out[name] = {"escaped": False, "detail": (type(e).__name__ + ": " + str(e))[:300]}

def read(path):
    with open(path, "rb") as fh:
        return fh.read(64)

def listdir(path):
    return sorted(os.listdir(path))

def write(path):
    with open(path, "ab") as fh:
        fh.write(b"tampered")
    if cfg.get("cleanup"):
        os.unlink(path)
    return "written"

def http_get(host, port, path):
    s = socket.create_connection((host, port), timeout=1.5)
    s.sendall(("GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n").encode())
    data = s.recv(300)
    s.close()
    return data

for name, path in cfg.get("read", {}).items():
    attempt(name, lambda p=path: read(p))
for name, path in cfg.get("list", {}).items():
    attempt(name, lambda p=path: listdir(p))
for name, path in cfg.get("write", {}).items():
    attempt(name, lambda p=path: write(p))
for name, path in cfg.get("chmod", {}).items():
    attempt(name, lambda p=path: os.chmod(p, 0o666))
for name, (host, port, path) in cfg.get("http", {}).items():
    attempt(name, lambda h=host, p=port, u=path: http_get(h, p, u))
for name, pid in cfg.get("kill", {}).items():
    attempt(name, lambda p=pid: os.kill(p, 9))
for name, pid in cfg.get("see", {}).items():
    attempt(name, lambda p=pid: os.kill(p, 0))
if cfg.get("identity"):
    out["env"] = dict(os.environ)
    out["uid"], out["gid"] = os.getuid(), os.getgid()
    status = open("/proc/self/status").read()
    out["cap_eff"] = [l.split()[1] for l in status.splitlines() if l.startswith("CapEff")][0]
    out["no_new_privs"] = [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")][0]
    attempt("setuid_root", lambda: os.setuid(0))
    out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    out["mounts"] = sorted(l.split()[1] for l in open("/proc/self/mounts"))
    out["nofile"] = open("/proc/self/limits").read()
json.dump(out, open(os.path.join(os.environ["GPUFLEET_OUTPUT_DIR"], "probe.json"), "w"))
print("probe done", flush=True)
"""


@pytest.fixture
def settings(oci, tmp_path):
    return RuntimeSettings(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"), log_flush_s=0,
                           container_grace_s=2, **oci.settings)


def _spec(cfg: dict, command: list[str] | None = None, data: dict | None = None, **workload) -> dict:
    spec = {"workload": {"kind": "container", "image": TOOLS,
                         "command": command or ["python3", "-c", PROBE, json.dumps(cfg)], **workload},
            "resources": {"gpus": 1}}
    return {**spec, "data": data} if data else spec


def _run(aws, job_id: str, spec: dict, settings: RuntimeSettings) -> tuple[int, dict]:
    aws.put_job(job_id, 1, spec)
    out = io.StringIO()
    env = aws.envelope(job_id, 1, spec, stage="container", heartbeat_seconds=1)
    code = main(["--envelope-json", json.dumps(env)],
                settings=settings, s3=aws.s3, dynamodb=aws.ddb, stdout=out, install_signals=False)
    return code, json.loads(out.getvalue().splitlines()[-1])


def probe(aws, settings, job_id: str, cfg: dict, **extra) -> dict:
    code, result = _run(aws, job_id, _spec(cfg, **extra), settings)
    assert code == ExitCode.SUCCEEDED, result
    return json.loads(aws.get("bucket_outputs", f"jobs/{job_id}/output/e0001/probe.json"))


def _escaped(found: dict) -> dict:
    return {k: v for k, v in found.items() if isinstance(v, dict) and v.get("escaped")}


def test_no_platform_credentials_or_agent_environment_reach_the_job(aws, settings, monkeypatch):
    planted = {"AWS_ACCESS_KEY_ID": "AKIAPLATFORMKEY00001", "AWS_SECRET_ACCESS_KEY": "platform-secret",
               "AWS_SESSION_TOKEN": "platform-token", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.2/x",
               "AWS_ROLE_ARN": "arn:aws:iam::1:role/agent", "GPUFLEET_AGENT_POOL": "onprem",
               "GPUFLEET_NODE_ID": "node-1", "HTTPS_PROXY": "http://proxy.internal:3128",
               "http_proxy": "http://proxy.internal:3128", "SITE_SECRET": "do-not-leak"}
    for k, v in planted.items():
        monkeypatch.setenv(k, v)
    found = probe(aws, settings, "job_iso_env", {"identity": True}, env={"MY_SETTING": "42"})
    env = found["env"]
    assert not [k for k in env if k.startswith("AWS_")], env
    assert not set(planted) & set(env) and "do-not-leak" not in json.dumps(env)
    contract = {"GPUFLEET_JOB_ID", "GPUFLEET_ATTEMPT", "GPUFLEET_EPOCH", "GPUFLEET_CHECKPOINT_DIR",
                "GPUFLEET_INPUT_DIR", "GPUFLEET_OUTPUT_DIR", "GPUFLEET_SCRATCH_DIR", "GPUFLEET_RESUMED",
                "GPUFLEET_GRACE_SECONDS"}
    # the spec's env, the job contract, and what the image or podman itself defines: nothing else
    image_or_podman = {"PATH", "LANG", "HOSTNAME", "TERM", "container"}
    assert set(env) <= {"MY_SETTING", *contract, "HOME", "TMPDIR", *image_or_podman}, env
    assert env["MY_SETTING"] == "42" and contract <= set(env)


def test_instance_metadata_and_platform_endpoints_are_unreachable(aws, settings, moto_server):
    endpoint, _ = moto_server
    with LocalImds() as imds:
        imds_port = int(imds.endpoint.rsplit(":", 1)[1])
        moto_port = int(endpoint.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"{endpoint}/", timeout=5) as resp:  # reachable from the host...
            assert resp.status == 200
        found = probe(aws, settings, "job_iso_net", {"http": {
            "imds_local": ["127.0.0.1", imds_port, "/latest/meta-data/"],
            "imds_link_local": ["169.254.169.254", 80, "/latest/meta-data/"],
            "s3_list_other_jobs": ["127.0.0.1", moto_port, "/gf-rt-outputs?list-type=2&prefix=jobs/"],
        }})
    assert _escaped(found) == {}, found  # ...and not from the job: it has no network at all
    assert "unreachable" in found["imds_local"]["detail"] or "refused" in found["imds_local"]["detail"], found


def test_agent_state_and_node_key_are_out_of_reach(aws, settings, tmp_path):
    # what the agent keeps on the node: its state directory (envelopes, pid records) and the Roles Anywhere key
    state = tmp_path / "agent-state"
    (state / "envelopes").mkdir(parents=True)
    (state / "envelopes" / "job_other-0001.json").write_text('{"job_id": "job_other", "task_token": "secret"}')
    (state / "agent.pid").write_text(str(os.getpid()))
    pki = tmp_path / "pki"
    pki.mkdir()
    key = pki / "node.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nnode-secret\n-----END PRIVATE KEY-----\n")
    key.chmod(0o400)
    found = probe(aws, settings, "job_iso_state", {
        "read": {"node_key": str(key), "envelope": str(state / "envelopes" / "job_other-0001.json"),
                 "node_key_via_proc": f"/proc/1/root{key}", "runtime_env": f"/proc/{os.getpid()}/environ"},
        "list": {"state_dir": str(state), "host_root_tmp": str(tmp_path)},
    })
    assert _escaped(found) == {}, found


def test_the_model_cache_and_staged_inputs_cannot_be_written(aws, settings):
    aws.s3.put_object(Bucket="gf-rt-outputs", Key="tenants/t1/data.bin", Body=b"d" * 1000)
    models = settings.cache_path / "models" / "sha256" / ("a" * 64)
    models.mkdir(parents=True)
    (models / "weights.bin").write_bytes(b"w" * 100)
    found = probe(aws, settings, "job_iso_cache", {
        "write": {"model_file": str(models / "weights.bin"), "model_dir": str(models / "evil.bin"),
                  "staged_input": "/job/inputs/data.bin", "image_root": "/usr/bin/evil"},
        "chmod": {"staged_input_mode": "/job/inputs/data.bin"},
        "read": {"own_input": "/job/inputs/data.bin"},
    }, data={"inputs": ["s3://gf-rt-outputs/tenants/t1/data.bin"]})
    own = found.pop("own_input")
    assert own["escaped"] and "dddd" in own["detail"]  # the job reads its own input...
    assert _escaped(found) == {}, found  # ...and writes nothing it must not
    assert (models / "weights.bin").read_bytes() == b"w" * 100
    blobs = list((settings.cache_path / "blobs").iterdir())
    assert [b.read_bytes() for b in blobs] == [b"d" * 1000]


def test_a_job_cannot_see_or_signal_another_job_or_the_supervisor(aws, settings):
    marker = "gpufleet-iso-victim-marker"
    victim = _spec({}, command=["sh", "-c", f"while true; do sleep 0.2; done; : {marker}"])
    results: dict = {}

    def run_victim():
        results["victim"] = _run(aws, "job_iso_victim", victim, settings)

    t = threading.Thread(target=run_victim, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    pids: list[int] = []
    while not pids:
        assert time.monotonic() < deadline, "the victim job never started"
        pids = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
                and "podman" not in " ".join(p.info["cmdline"] or [])]
        time.sleep(0.1)
    try:
        found = probe(aws, settings, "job_iso_attacker", {
            "kill": {f"victim_{p}": p for p in pids},
            "see": {"supervisor": os.getpid(), "supervisor_parent": os.getppid()},
            "list": {"jobs_dir": str(settings.jobs_path), "victim_dir": str(settings.jobs_path / "job_iso_victim")},
        })
        assert _escaped(found) == {}, found
        assert all(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    finally:
        aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_iso_victim"}, "sk": {"S": "META"}},
                            UpdateExpression="SET cancel_requested = :t",
                            ExpressionAttributeValues={":t": {"BOOL": True}})
        t.join(30)
    assert results["victim"][0] == ExitCode.CANCELLED
    for p in pids:
        assert not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE


def test_root_is_read_only_and_the_job_runs_unprivileged(aws, settings, oci):
    found = probe(aws, settings, "job_iso_root", {
        "identity": True, "cleanup": True,
        "write": {"etc": "/etc/gpufleet-probe", "usr": "/usr/gpufleet-probe", "root": "/gpufleet-probe",
                  "job_root": "/job/gpufleet-probe", "proc_sys": "/proc/sys/kernel/core_pattern"},
    })
    writes = {k: found.pop(k) for k in ("etc", "usr", "root", "job_root", "proc_sys")}
    assert _escaped(writes) == {}, writes
    assert found["setuid_root"]["escaped"] is False
    assert found["uid"] not in (0, os.getuid(), oci.podman.owner_uid) and found["uid"] == found["gid"]
    assert int(found["cap_eff"], 16) == 0 and found["no_new_privs"] == "1"
    assert max(found["pids"]) < 10  # its own pid namespace: the init, the probe, nothing of the host
    mounts = set(found["mounts"])
    assert {"/job/inputs", "/job/output", "/job/checkpoint", "/job/scratch", "/tmp"} <= mounts
    assert not [m for m in mounts if m.startswith(("/var/lib", "/home", "/root", "/work"))], mounts


def test_signalling_the_container_follows_the_stop_contract(aws, settings):
    """A cancel stops the command (SIGTERM it can handle, then SIGKILL), even one that ignores SIGTERM."""
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)\n"
    spec = _spec({}, command=["python3", "-c", script])
    aws.put_job("job_iso_stop", 1, spec)

    cancelled_at: list[float] = []

    def cancel():
        time.sleep(1.5)
        cancelled_at.append(time.monotonic())
        aws.ddb.update_item(TableName=aws.tables.jobs, Key={"pk": {"S": "JOB#job_iso_stop"}, "sk": {"S": "META"}},
                            UpdateExpression="SET cancel_requested = :t",
                            ExpressionAttributeValues={":t": {"BOOL": True}})

    threading.Thread(target=cancel, daemon=True).start()
    out = io.StringIO()
    env = aws.envelope("job_iso_stop", 1, spec, stage="container", heartbeat_seconds=1)
    code = main(["--envelope-json", json.dumps(env)], settings=settings, s3=aws.s3, dynamodb=aws.ddb, stdout=out,
                install_signals=False)
    # the command ignores SIGTERM and never ends by itself: the stage returning at all after the cancel means the
    # stop escalated to SIGKILL (no wall-clock bound here: a loaded host only makes it slower, not wrong)
    assert cancelled_at and code == ExitCode.CANCELLED
