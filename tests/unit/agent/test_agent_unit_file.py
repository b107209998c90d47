"""The systemd unit: hardening directives present and sane; `systemd-analyze verify` clean where
the tool exists (and it does flag a broken copy, so a clean result means something)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[3] / "onprem_agent" / "packaging" / "gpufleet-agent.service"
TOML = UNIT.with_name("agent.toml")


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = sections.setdefault(m.group(1), [])
            continue
        key, _, value = line.partition("=")
        assert current is not None and _ == "=", f"bad line {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def _one(entries: list[tuple[str, str]], key: str) -> str:
    values = [v for k, v in entries if k == key]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def _seconds(v: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", v)
    assert m, v
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_hardening_directives():
    svc = parse_unit(UNIT.read_text())["Service"]
    assert _one(svc, "User") == "gpufleet" and _one(svc, "Group") == "gpufleet"
    for key, want in {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "CapabilityBoundingSet": "",
        "Restart": "on-failure", "KillSignal": "SIGTERM", "DevicePolicy": "closed", "UMask": "0077",
    }.items():
        assert _one(svc, key) == want, key
    # writable paths are explicit and exactly the agent's own directories
    rw = _one(svc, "ReadWritePaths").split()
    assert rw == ["/var/lib/gpufleet-agent", "/var/cache/gpufleet-agent", "/var/log/gpufleet-agent"]
    # the stop timeout leaves the drain (jobs checkpointing) time to finish
    drain = float(re.search(r"^drain_timeout_s\s*=\s*([\d.]+)", TOML.read_text(), re.M).group(1))
    assert _seconds(_one(svc, "TimeoutStopSec")) > drain
    assert _one(svc, "KillMode") == "mixed"  # SIGTERM to the agent alone; it forwards to jobs
    assert "--check" in _one(svc, "ExecStartPre")
    assert _one(svc, "ExecStart").endswith("gpufleet agent --config /etc/gpufleet/agent.toml")
    assert any(k == "DeviceAllow" and v.startswith("/dev/nvidiactl") for k, v in svc)
    assert parse_unit(UNIT.read_text())["Install"] == [("WantedBy", "multi-user.target")]


def _verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)


def test_systemd_analyze_verify_when_available(tmp_path):
    if shutil.which("systemd-analyze") is None:
        # No systemd tooling on this machine: the directive checks above are the verification.
        assert parse_unit(UNIT.read_text())["Service"]
        return
    # verify checks that ExecStart binaries exist: point them at this environment's console script.
    gpufleet = Path(sys.executable).with_name("gpufleet")
    local = tmp_path / "gpufleet-agent.service"
    local.write_text(UNIT.read_text().replace("/opt/gpufleet/venv/bin/gpufleet", str(gpufleet)))
    res = _verify(local)
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr
    # the tool does catch mistakes: a broken copy is reported
    broken = tmp_path / "broken.service"
    broken.write_text(local.read_text().replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe"))
    bad = _verify(broken)
    assert "Failed to parse boolean value" in bad.stderr or bad.returncode != 0, bad.stderr
    sec = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(local)],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", sec.stdout + sec.stderr)
    assert m and float(m.group(1)) <= 2.5, sec.stdout[-2000:]


DROP_IN = UNIT.with_name("gpufleet-agent.service.d") / "tenant-containers.conf"


def test_the_tenant_containers_drop_in_relaxes_only_what_rootless_podman_needs(tmp_path):
    extra = parse_unit(DROP_IN.read_text())
    assert set(extra) == {"Service"}
    keys = {k for k, _ in extra["Service"]}
    assert keys == {"NoNewPrivileges", "CapabilityBoundingSet", "RestrictNamespaces", "ProtectKernelTunables",
                    "ProtectProc", "SystemCallFilter", "Environment", "RuntimeDirectory", "RuntimeDirectoryMode",
                    "DeviceAllow"}
    svc = dict(extra["Service"])
    assert svc["CapabilityBoundingSet"] == "CAP_SETUID CAP_SETGID"  # for newuidmap/newgidmap only
    # the base unit keeps everything else: read-only system, own writable directories, private /tmp, no home
    base = parse_unit(UNIT.read_text())["Service"]
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "UMask", "DevicePolicy"):
        assert key not in keys and _one(base, key)
    if shutil.which("systemd-analyze") is None:
        return
    gpufleet = Path(sys.executable).with_name("gpufleet")
    merged = tmp_path / "gpufleet-agent.service"
    text = UNIT.read_text().replace("/opt/gpufleet/venv/bin/gpufleet", str(gpufleet))
    body = DROP_IN.read_text().split("[Service]", 1)[1]
    merged.write_text(text.replace("[Install]", body + "\n[Install]"))
    res = _verify(merged)
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr
