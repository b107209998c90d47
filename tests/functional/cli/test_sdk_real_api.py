"""gpufleet.Client and the CLI against the real SigV4 gateway and API handler on moto.

The gateway verifies every signature itself; the API handler is the one the Lambda runs.
"""

from __future__ import annotations

import json

import pytest
from real_api import REGION, User, real_api

from gpufleet import errors
from gpufleet.cli.main import main
from gpufleet.profile import Profile, write_profile
from gpufleet.sdk import Client
from gpufleet.status import JobStatus

pytestmark = pytest.mark.xdist_group("cli-real-api")

ARN = "arn:aws:iam::123456789012:user/dev"
OTHER = "arn:aws:iam::123456789012:user/eve"
KEY, SECRET = "AKIADEVSDKTEST00001", "dev-sdk-secret-0000000000000000000000000"
OTHER_KEY, OTHER_SECRET = "AKIAEVESDKTEST00001", "eve-sdk-secret-0000000000000000000000000"
QUOTA = "arn:aws:iam::123456789012:user/quinn"
QUOTA_KEY, QUOTA_SECRET = "AKIAQUINNSDKTEST001", "quinn-sdk-secret-00000000000000000000000"
VIDEO = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}


@pytest.fixture(scope="module")
def api():
    users = [User(ARN, "acme", "vision", "dev", KEY, SECRET), User(OTHER, "other", "audio", "eve", OTHER_KEY, OTHER_SECRET),
             User(QUOTA, "acme", "busy", "quinn", QUOTA_KEY, QUOTA_SECRET)]
    with real_api(users, buckets=("gpufleet-outputs", "gpufleet-logs"),
                  cursor_secret="cursor-secret-for-sdk-tests-0001", queued_jobs_per_user=6) as stack:
        yield stack["gw"]


def client_for(gw, key=KEY, secret=SECRET, **kw) -> Client:
    return Client(profile=Profile(endpoint=gw.url, region=REGION, access_key_id=key, secret_access_key=secret), **kw)


def test_submit_get_list_cancel_events_through_the_real_api(api):
    client = client_for(api)
    first = client.submit(VIDEO, idempotency_key="sdk-key-1")
    assert first.status == JobStatus.QUEUED and first.owner == "acme/vision/dev"
    replay = client.submit(VIDEO, idempotency_key="sdk-key-1")
    assert replay.job_id == first.job_id
    with pytest.raises(errors.IdempotencyMismatch):
        client.submit({"workload": {"kind": "video.generate", "prompt": "something else"}}, idempotency_key="sdk-key-1")
    more = [client.submit(VIDEO).job_id for _ in range(3)]
    assert len(set(more)) == 3
    assert client.get(first.job_id).job_id == first.job_id
    listed = [j.job_id for j in client.iter_jobs(page_size=2)]
    mine = [first.job_id, *more]
    assert [j for j in listed if j in mine] == list(reversed(mine))  # newest first, across pages
    assert len(listed) == len(set(listed))
    cancelled = client.cancel(more[0])
    assert cancelled.job_id == more[0]
    assert client.get(more[0]).model_extra.get("cancel_requested") is True
    events = client.events(first.job_id)
    assert events and events[0].ts
    with pytest.raises(errors.NotFound):
        client.get("job_00000000000000000000000000")


def test_other_tenants_jobs_are_invisible_and_bad_keys_refused(api):
    mine = client_for(api).submit(VIDEO)
    eve = client_for(api, OTHER_KEY, OTHER_SECRET)
    with pytest.raises(errors.NotFound):
        eve.get(mine.job_id)
    assert mine.job_id not in [j.job_id for j in eve.iter_jobs()]
    with pytest.raises(errors.Unauthorized):
        client_for(api, KEY, "not-the-secret").get(mine.job_id)


def test_soft_quota_429_is_raised_with_retry_after(api):
    from gpufleet.sdk_retry import RetryPolicy

    client = client_for(api, QUOTA_KEY, QUOTA_SECRET, retry=RetryPolicy(max_retry_after_s=1))
    for _ in range(6):
        client.submit(VIDEO)
    with pytest.raises(errors.QuotaExceeded) as info:
        client.submit(VIDEO)
    assert info.value.retry_after == 30 and info.value.status == 429


def cli_json(text: str):
    """The CLI's JSON document; the in-process API handler's structured logs and EMF lines are dropped."""
    kept = [ln for ln in text.splitlines() if not ln.startswith(('{"level"', '{"_aws"'))]
    return json.loads("\n".join(kept))


def test_cli_against_the_real_api(api, tmp_path, monkeypatch, capsys):
    profile = write_profile(
        Profile(endpoint=api.url, region=REGION, access_key_id=KEY, secret_access_key=SECRET), tmp_path / "p.json"
    )
    monkeypatch.setenv("GPUFLEET_PROFILE", str(profile))
    assert main(["submit", "a fox in snow", "--frames", "5", "--json"]) == 0
    job = cli_json(capsys.readouterr().out)
    assert job["spec"]["workload"]["frames"] == 5
    for argv in (
        ["status", job["job_id"], "--json"],
        ["ls", "--json"],
        ["events", job["job_id"], "--json"],
        ["quota", "--json"],
        ["pools", "--json"],
        ["models", "--json"],
    ):
        assert main(argv) == 0, argv
        cli_json(capsys.readouterr().out)
    assert main(["cancel", job["job_id"]]) == 0
    assert "cancellation requested" in capsys.readouterr().out
    assert main(["output", job["job_id"]]) == 1
    assert "SUCCEEDED jobs only" in capsys.readouterr().err


def test_cli_webhook_endpoints_through_the_real_api(api, tmp_path, monkeypatch, capsys):
    profile = write_profile(
        Profile(endpoint=api.url, region=REGION, access_key_id=KEY, secret_access_key=SECRET), tmp_path / "p.json"
    )
    monkeypatch.setenv("GPUFLEET_PROFILE", str(profile))
    assert main(["webhooks", "endpoints", "create", "https://10.0.0.5/hook"]) == 1  # private: refused
    assert "url:" in capsys.readouterr().err
    assert main(["webhooks", "endpoints", "create", "https://hooks.example.com/gpufleet", "--event", "started",
                 "--event", "completed", "--label", "team=vision", "--json"]) == 0
    ep = cli_json(capsys.readouterr().out)
    assert ep["events"] == ["started", "completed"] and ep["labels"] == {"team": "vision"}
    assert main(["webhooks", "endpoints", "list"]) == 0
    assert ep["id"] in capsys.readouterr().out
    assert main(["webhooks", "endpoints", "disable", ep["id"], "--json"]) == 0
    assert cli_json(capsys.readouterr().out)["enabled"] is False
    with pytest.raises(errors.NotFound):  # another tenant's endpoint is not found
        client_for(api, OTHER_KEY, OTHER_SECRET).webhook_endpoint(ep["id"])
    assert main(["webhooks", "endpoints", "delete", ep["id"]]) == 0
    assert main(["webhooks", "endpoints", "get", ep["id"]]) == 1
    assert "no webhook endpoint" in capsys.readouterr().err
