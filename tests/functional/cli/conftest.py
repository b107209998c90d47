"""Fixtures of the SDK/CLI functional tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sdk_loopback import ACCESS_KEY, REGION, SECRET_KEY, LoopbackServer  # noqa: E402

from gpufleet.clock import FakeClock  # noqa: E402
from gpufleet.profile import Profile  # noqa: E402
from gpufleet.sdk import Client  # noqa: E402


@pytest.fixture
def loopback():
    server = LoopbackServer().start()
    yield server
    server.stop()


class SleepRecorder:
    """Records requested sleeps and advances a fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def fake_clock():
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
def sleeps(fake_clock):
    return SleepRecorder(fake_clock)


@pytest.fixture
def client_for(fake_clock, sleeps):
    def make(server: LoopbackServer, **kw) -> Client:
        profile = Profile(
            endpoint=server.endpoint, region=REGION, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY
        )
        kw.setdefault("clock", fake_clock)
        kw.setdefault("sleep", sleeps)
        kw.setdefault("rand", lambda: 0.5)
        return Client(profile=profile, **kw)

    return make


@pytest.fixture
def offline_cli(monkeypatch, tmp_path):
    """The environment of a CLI test against moto in-process: test credentials and region, no endpoint, profile
    or session token from the host, HOME and the working directory in ``tmp_path``; returns ``setenv`` for more."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_REGION": "us-east-1", "HOME": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "GPUFLEET_ENDPOINT", "GPUFLEET_PROFILE", "AWS_SESSION_TOKEN", "GPUFLEET_MODEL_S3_ROOT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch.setenv

