"""``Client.deliveries`` and ``gpufleet deliveries`` against the real SigV4 gateway and API on moto.

The delivery log is written by the real webhook sender (``gpufleet.webhooks.delivery``) posting
to a loopback receiver, so the test reads what production writes, not a hand-made item.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from real_api import REGION, User, real_api

from gpufleet import errors
from gpufleet.cli.main import main
from gpufleet.clock import FakeClock
from gpufleet.profile import Profile, write_profile
from gpufleet.sdk import Client
from gpufleet.store.webhook_keys import DynamoWebhookKeys, KmsSecretBox

pytestmark = pytest.mark.xdist_group("cli-deliveries-real-api")

ARN = "arn:aws:iam::123456789012:user/dev"
OTHER = "arn:aws:iam::123456789012:user/eve"
KEY, SECRET = "AKIADELIVERIESTEST01", "dev-deliveries-secret-000000000000000000"
OTHER_KEY, OTHER_SECRET = "AKIAEVEDELIVERIES001", "eve-deliveries-secret-000000000000000000"
MISSING = "job_00000000000000000000000000"


@pytest.fixture(scope="module")
def receiver():
    """A webhook receiver answering with the statuses queued in ``state["statuses"]`` (then 204)."""
    state: dict = {"statuses": [], "got": 0}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            state["got"] += 1
            self.send_response(state["statuses"].pop(0) if state["statuses"] else 204)
            self.end_headers()

        def log_message(self, *a):
            return

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    yield state
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def stack():
    users = [User(ARN, "acme", "vision", "dev", KEY, SECRET), User(OTHER, "other", "audio", "eve", OTHER_KEY, OTHER_SECRET)]
    with real_api(users, cursor_secret="cursor-secret-for-deliveries-test1", webhook_allow_private=True) as stack:
        sqs = boto3.client("sqs", region_name=REGION)
        queue = sqs.create_queue(QueueName="deliveries-test-hooks")["QueueUrl"]
        kms = boto3.client("kms", region_name=REGION)  # the tenant's signing secret, KMS-encrypted on its item
        box = KmsSecretBox(kms, kms.create_key(Description="webhook secrets")["KeyMetadata"]["Arn"])
        keys = DynamoWebhookKeys(stack["ddb"], stack["names"].control, box)
        yield {**stack, "sqs": sqs, "queue": queue, "keys": keys}


def client_for(stack, key=KEY, secret=SECRET) -> Client:
    gw = stack["gw"]
    return Client(profile=Profile(endpoint=gw.url, region=REGION, access_key_id=key, secret_access_key=secret))


def spec(url: str | None) -> dict:
    out: dict = {"workload": {"kind": "video.generate", "prompt": "a red fox running in snow"}}
    if url:
        out["webhook"] = {"url": url, "events": ["completed"]}
    return out


def deliver_completed(stack, job_id: str, tries: int, clock: FakeClock) -> None:
    """Queue the job's ``completed`` event and run the real sender ``tries`` times (receive count 1..n)."""
    from gpufleet.store import jobs as job_store
    from gpufleet.webhooks import delivery

    names = stack["names"]
    job = job_store.get_job(stack["ddb"], names.jobs, job_id)
    job["status"] = "SUCCEEDED"
    from gpufleet.jobrecord import JobRecord

    delivery.enqueue(stack["sqs"], stack["queue"], JobRecord.from_item(job), "completed", clock=clock)
    (msg,) = stack["sqs"].receive_message(QueueUrl=stack["queue"])["Messages"]
    for n in range(1, tries + 1):
        delivery.deliver_message(
            msg["Body"], n, ddb=stack["ddb"], jobs_table=names.jobs, control_table=names.control, clock=clock,
            keys=stack["keys"],
            allow_private=True,  # the receiver is on loopback
        )
        clock.advance(5)
    stack["sqs"].delete_message(QueueUrl=stack["queue"], ReceiptHandle=msg["ReceiptHandle"])


@pytest.fixture(scope="module")
def delivered_job(stack, receiver):
    """A job whose ``completed`` webhook failed once (HTTP 500), then was delivered (204)."""
    job = client_for(stack).submit(spec(receiver["url"]))
    receiver["statuses"][:] = [500]
    deliver_completed(stack, job.job_id, 2, FakeClock(start=1_800_000_000.0))
    assert receiver["got"] == 2
    return job.job_id


def test_sdk_returns_every_try_oldest_first(stack, delivered_job):
    first, second = client_for(stack).deliveries(delivered_job)
    assert (first.attempt, first.status_code, first.delivered) == (1, 500, False)
    assert first.next_retry_at == "2027-01-15T08:00:05.000Z" and not first.dead_lettered  # 5 s after the try
    assert (second.attempt, second.status_code, second.delivered, second.next_retry_at) == (2, 204, True, None)
    assert first.at == "2027-01-15T08:00:00.000Z" and second.at == "2027-01-15T08:00:05.000Z"
    assert first.event_type == second.event_type == "job.completed"
    assert first.msg_id == second.msg_id and first.url.endswith("/hook")


def test_sdk_empty_log_unknown_job_and_other_tenant(stack, delivered_job):
    client = client_for(stack)
    assert client.deliveries(client.submit(spec(None)).job_id) == []
    with pytest.raises(errors.NotFound) as info:
        client.deliveries(MISSING)
    assert info.value.status == 404 and MISSING in info.value.detail
    with pytest.raises(errors.NotFound):
        client_for(stack, OTHER_KEY, OTHER_SECRET).deliveries(delivered_job)


def cli_json(text: str):
    """The CLI's JSON document; the in-process API handler's structured logs and EMF lines are dropped."""
    kept = [ln for ln in text.splitlines() if not ln.startswith(('{"level"', '{"_aws"'))]
    return json.loads("\n".join(kept))


def cli_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith(('{"level"', '{"_aws"'))]


@pytest.fixture
def profile_env(stack, tmp_path, monkeypatch):
    path = write_profile(
        Profile(endpoint=stack["gw"].url, region=REGION, access_key_id=KEY, secret_access_key=SECRET),
        tmp_path / "p.json",
    )
    monkeypatch.setenv("GPUFLEET_PROFILE", str(path))
    return path


def test_cli_table_and_json(stack, delivered_job, profile_env, capsys):
    assert main(["deliveries", delivered_job]) == 0
    header, first, second = cli_lines(capsys.readouterr().out)
    assert header.split() == ["TIME", "EVENT", "ATTEMPT", "STATUS", "DELIVERED", "NEXT", "RETRY"]
    assert first.split() == ["2027-01-15T08:00:00.000Z", "job.completed", "1", "500", "no", "2027-01-15T08:00:05.000Z"]
    assert second.split() == ["2027-01-15T08:00:05.000Z", "job.completed", "2", "204", "yes"]
    assert main(["deliveries", delivered_job, "--json"]) == 0
    doc = cli_json(capsys.readouterr().out)
    assert [(d["attempt"], d["status_code"], d["delivered"]) for d in doc] == [(1, 500, False), (2, 204, True)]
    assert doc[0]["next_retry_at"] == "2027-01-15T08:00:05.000Z" and doc[1]["event_type"] == "job.completed"


def test_cli_unknown_job_is_one_line_and_exit_1(stack, profile_env, capsys):
    assert main(["deliveries", MISSING]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"gpufleet: error: job {MISSING} not found\n"
    assert cli_lines(captured.out) == []
