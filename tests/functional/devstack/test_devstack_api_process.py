"""The API front door in a process of its own (gpufleet.devstack.api_process): signed requests reach the handler
in the child, the parent's foreground gate is held while one is answered, keys added or resolved by the parent are
accepted, and the child never outlives its parent (stopped, or SIGKILLed from its main thread or another one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gpufleet.devstack.api_process import ApiProcess, ApiSpec
from gpufleet.devstack.gateway import LocalCredential
from gpufleet.local.foreground import ForegroundGate

HERE = Path(__file__).parent
DEV = LocalCredential(access_key_id="AKIADEVELOPER0001", secret_access_key="s3cr3t-dev",
                      principal_arn="arn:aws:iam::123456789012:user/t/t/dev")


def spec(**extra) -> ApiSpec:
    return ApiSpec(region="us-east-1", endpoint_url="http://127.0.0.1:1", credentials=[DEV], functions={},
                   cursor_secret="c", watermark_keys="/nonexistent", gang_silence_s="5", admin_resources=[],
                   factory="api_process_echo:build", **extra)


@pytest.fixture
def child_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def call(url: str, path: str, cred: LocalCredential | None, timeout: float = 30.0) -> tuple[int, dict]:
    req = AWSRequest(method="GET", url=url + path, headers={})
    if cred is not None:
        SigV4Auth(Credentials(cred.access_key_id, cred.secret_access_key), "execute-api", "us-east-1").add_auth(req)
    r = urllib.request.Request(url + path, headers=dict(req.headers.items()), method="GET")
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            body = json.loads(resp.read())
            body.pop("pid", None)
            body.pop("handled", None)
            return resp.status, body
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def answer_of(url: str, path: str = "/v1/jobs") -> dict:
    """The echo answer to a signed request on a new connection (``pid``: the API process that answered)."""
    req = AWSRequest(method="GET", url=url + path, headers={})
    SigV4Auth(Credentials(DEV.access_key_id, DEV.secret_access_key), "execute-api", "us-east-1").add_auth(req)
    r = urllib.request.Request(url + path, headers=dict(req.headers.items()), method="GET")
    with urllib.request.urlopen(r, timeout=30) as resp:
        return json.loads(resp.read())


def gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def settles(gate: ForegroundGate, within_s: float = 10.0) -> bool:
    """Whether the gate has no open section within ``within_s`` (the child's close of a section reaches this
    process's reader thread a moment after the answer may reach the client)."""
    deadline = time.monotonic() + within_s
    while gate.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    return not gate.busy


def test_signed_requests_reach_the_child_and_the_gate_is_held_while_one_is_open(child_path):
    gate = ForegroundGate(max_wait_s=30.0)
    other = LocalCredential(access_key_id="AKIAOTHERUSER0002", secret_access_key="other",
                            principal_arn="arn:aws:iam::123456789012:user/t/t/other")
    resolved = LocalCredential(access_key_id="ASIASESSION000003", secret_access_key="sess",
                               principal_arn="arn:aws:sts::123456789012:assumed-role/r/s")
    asked: list[str] = []

    def resolve(key: str):
        asked.append(key)
        return resolved if key == resolved.access_key_id else None

    proc = ApiProcess(lambda: spec(), gate=gate, resolve=resolve)
    proc.start()
    try:
        assert proc.pid != os.getpid() and proc.url.startswith("http://127.0.0.1:")
        assert call(proc.url, "/v1/jobs", DEV) == (200, {"user_arn": DEV.principal_arn, "path": "/v1/jobs"})
        assert call(proc.url, "/v1/jobs", None)[0] == 403  # unsigned: never reaches the handler
        assert call(proc.url, "/v1/jobs", other)[0] == 403  # not known yet
        proc.add_credential(other)
        assert call(proc.url, "/v1/jobs", other) == (200, {"user_arn": other.principal_arn, "path": "/v1/jobs"})
        assert call(proc.url, "/v1/jobs", resolved)[1]["user_arn"] == resolved.principal_arn  # asked the parent
        assert resolved.access_key_id in asked
        assert settles(gate) and proc.sections >= 4
        out: list = []
        t = threading.Thread(target=lambda: out.append(call(proc.url, "/slow?s=1.5", DEV)), daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while not gate.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.busy  # the child's open request holds this process's gate
        waited = gate.background_turn()  # background work here waits for it
        t.join(30)
        assert out and out[0][0] == 200 and 0.1 < waited < 30 and settles(gate)
    finally:
        pid = proc.pid
        proc.stop()
    assert gone(pid, 5.0) and not gate.busy


def test_a_child_that_dies_releases_its_open_sections(child_path):
    gate = ForegroundGate(max_wait_s=30.0)
    proc = ApiProcess(lambda: spec(), gate=gate)
    proc.start()
    try:
        def killed_mid_request():
            with pytest.raises(OSError):  # the connection ends with the child
                call(proc.url, "/slow?s=60", DEV, timeout=60)

        t = threading.Thread(target=killed_mid_request, daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while not gate.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.busy
        proc.children[0].proc.kill()
        deadline = time.monotonic() + 10
        while gate.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not gate.busy
    finally:
        proc.stop()


PARENT = textwrap.dedent("""
    import sys, threading, time
    sys.path.insert(0, {here!r})
    from test_devstack_api_process import spec
    from gpufleet.devstack.api_process import ApiProcess
    proc = ApiProcess(lambda: spec())
    if {thread!r}:
        t = threading.Thread(target=proc.start)
        t.start(); t.join()
    else:
        proc.start()
    print(proc.pid, proc.url, flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("thread", [False, True], ids=["main-thread", "other-thread"])
def test_the_child_dies_with_a_sigkilled_parent(child_path, thread):
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(here=str(HERE), thread=thread)],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline().split()
        assert line, "the parent did not start its API process"
        pid, url = int(line[0]), line[1]
        assert call(url, "/v1/jobs", DEV)[0] == 200
        parent.kill()
        parent.wait(10)
        assert gone(pid, 5.0)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_several_processes_share_one_port_and_answer_concurrently(child_path):
    gate = ForegroundGate(max_wait_s=30.0)
    other = LocalCredential(access_key_id="AKIAOTHERUSER0002", secret_access_key="other",
                            principal_arn="arn:aws:iam::123456789012:user/t/t/other")
    proc = ApiProcess(lambda: spec(), gate=gate, processes=2)
    proc.start()
    pids = list(proc.pids)
    try:
        assert len(set(pids)) == 2
        answered = {answer_of(proc.url)["pid"] for _ in range(16)}  # a new connection each: the kernel spreads them
        assert answered == set(pids)
        proc.add_credential(other)  # every process takes it
        assert all(call(proc.url, "/v1/jobs", other)[0] == 200 for _ in range(8))
        with ThreadPoolExecutor(16) as pool:
            slow = list(pool.map(lambda _: answer_of(proc.url, "/slow?s=0.5"), range(16)))
        assert {a["pid"] for a in slow} == set(pids)
        by_pid = {p: sorted(a["handled"] for a in slow if a["pid"] == p) for p in pids}
        for spans in by_pid.values():  # each process one request at a time
            assert all(a[1] <= b[0] + 0.01 for a, b in zip(spans, spans[1:], strict=False))
        first, second = by_pid.values()  # both processes at once
        assert any(a[0] < b[1] and b[0] < a[1] for a in first for b in second)
        assert settles(gate) and proc.sections >= 40
    finally:
        proc.stop()
    assert all(gone(pid, 5.0) for pid in pids)
