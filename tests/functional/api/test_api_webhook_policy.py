"""POST /v1/jobs applies the webhook URL policy's submit-time check: 400 problem+json, key not consumed."""

from __future__ import annotations

import pytest
from api_helpers import VIDEO


def _with_hook(url: str) -> dict:
    return {**VIDEO, "webhook": {"url": url, "events": ["completed"]}}


def submit(call, body, key="wh-1"):
    return call("POST", "/v1/jobs", body, headers={"Idempotency-Key": key})


@pytest.mark.parametrize(("url", "says"), [
    ("http://hooks.example.com/x", "scheme must be https"),
    ("https://169.254.169.254/latest/meta-data/", "169.254.169.254: link-local"),
    ("https://10.0.0.7/h", "10.0.0.7: private (RFC 1918)"),
    ("https://[::ffff:192.168.1.1]/h", "private (RFC 1918) (IPv4 embedded in IPv6)"),
    ("https://2130706433/h", "127.0.0.1: loopback"),  # pydantic normalises the numeric form
    ("https://localhost:8443/h", "loopback name"),
])
def test_refused_webhook_url_is_a_400_validation_problem(call, url, says):
    r = submit(call, _with_hook(url))
    assert r.status == 400 and r.headers["content-type"] == "application/problem+json"
    assert r.json["type"].endswith("/validation") and says in r.json["detail"]
    assert r.json["detail"].startswith("webhook.url: ")
    assert r.json["errors"][0]["field"] == "webhook.url" and says in r.json["errors"][0]["message"]
    assert submit(call, VIDEO).status == 202  # the Idempotency-Key was not consumed by the refused request


def test_public_https_hostname_is_accepted_without_resolving(call):
    r = submit(call, _with_hook("https://hooks.internal.invalid/x"))  # DNS is the sender's job
    assert r.status == 202 and r.json["spec"]["webhook"]["url"] == "https://hooks.internal.invalid/x"


class TestLocalDevelopmentSetting:
    @pytest.fixture
    def settings_kw(self):
        return {"webhook_allow_private": True}

    def test_loopback_http_accepted_when_allowed(self, call):
        assert submit(call, _with_hook("http://127.0.0.1:9000/h")).status == 202


def test_setting_comes_from_the_environment(monkeypatch):
    from gpufleet.api.settings import load

    monkeypatch.setenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE", "true")
    assert load(cursor_secret="x" * 16).webhook_allow_private is True
    monkeypatch.delenv("GPUFLEET_WEBHOOK_ALLOW_PRIVATE")
    assert load(cursor_secret="x" * 16).webhook_allow_private is False
