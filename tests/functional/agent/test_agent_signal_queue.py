"""The agent's signal-queue adapter (:class:`onprem_agent.aws.SignalQueue`) on moto: nudges read and deleted,
malformed ones dropped, a missing queue an outcome (None) rather than an error."""

from __future__ import annotations

import json

import boto3
from fast_moto import fast_mock_aws

from gpufleet.store.queues import SqsNodeSignals, ensure_node_queue
from onprem_agent.aws import SignalQueue


def test_nudges_are_read_once_malformed_ones_dropped_and_a_missing_queue_is_none(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with fast_mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        q = ensure_node_queue(sqs, "node-s", prefix="gpufleet-node-", max_receives=3)
        signals = SignalQueue(sqs, q.signals_url)
        assert SqsNodeSignals(sqs).nudge(q.queue_url, "job-1", 2)
        for body in ("not json", json.dumps({"type": "cancel", "job_id": "job-2"}), json.dumps({"type": "other"})):
            sqs.send_message(QueueUrl=q.signals_url, MessageBody=body)
        got = []
        for _ in range(4):
            got += signals.receive(0)
        assert got == [("job-1", 2)]
        assert signals.receive(0) == []  # deleted once read: a nudge is worth one heartbeat
        assert sqs.receive_message(QueueUrl=q.queue_url, WaitTimeSeconds=0).get("Messages") is None  # no work sent
        gone = "https://sqs.us-east-1.amazonaws.com/123456789012/gpufleet-node-old"
        assert SignalQueue(sqs, gone + "_signals").receive(0) is None
        assert SqsNodeSignals(sqs).nudge(gone, "job-1", 2) is False


def test_an_unreachable_sqs_is_a_lost_nudge_not_an_error():
    """The API's cancel is already recorded when it nudges: SQS being down must not turn the DELETE into a 5xx."""
    from botocore.exceptions import EndpointConnectionError

    class Down:
        def send_message(self, **_kw):
            raise EndpointConnectionError(endpoint_url="https://sqs.invalid")

    assert SqsNodeSignals(Down()).nudge("https://sqs.invalid/1/gpufleet-node-n1", "job-1", 1) is False
