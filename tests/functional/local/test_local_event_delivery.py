"""The EventBridge → Lambda delivery component of the dev stack (gpufleet.local.event_delivery.AsyncEventDelivery).

Pins moto's own behaviour first (a put matching a rule with a Lambda target fails), so the test fails when moto changes
and the component can go; then checks that matching events reach the function after the put, on the
delivery's thread, that other events do not, and that a burst costs one invocation per function wait.
"""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest
from moto import mock_aws

from gpufleet.devstack import stack as devstack_stack
from gpufleet.local.event_delivery import AsyncEventDelivery
from gpufleet.local.moto_patches import patch_lambda

REGION = "us-east-1"


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def _put(events, detail_type: str, job: str) -> None:
    events.put_events(Entries=[{"Source": "gpufleet", "DetailType": detail_type, "Detail": json.dumps({"job_id": job}),
                                "EventBusName": "bus"}])


def test_rule_lambda_targets_are_invoked_after_the_put(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert devstack_stack.AsyncEventDelivery is AsyncEventDelivery  # the dev stack uses this one
    seen: list[dict] = []
    gate = threading.Event()
    gate.set()

    def invoker(fn, event):
        gate.wait(10)
        body = json.loads(event) if isinstance(event, str | bytes) else event
        seen.append({"fn": fn.function_name, "type": body["detail-type"], "job": body["detail"]["job_id"],
                     "thread": threading.current_thread().name})
        return json.dumps({"ok": True}), False, ""

    with mock_aws(), patch_lambda(invoker):
        role = boto3.client("iam", region_name=REGION).create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam = boto3.client("lambda", region_name=REGION)
        fn_arn = lam.create_function(FunctionName="scheduler", Runtime="python3.11", Role=role, Handler="h.handler",
                                     Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})["FunctionArn"]
        events = boto3.client("events", region_name=REGION)
        events.create_event_bus(Name="bus")
        events.put_rule(Name="wake", EventBusName="bus",
                        EventPattern=json.dumps({"source": ["gpufleet"], "detail-type": ["JobPending", "CapacityFreed"]}))
        events.put_targets(Rule="wake", EventBusName="bus", Targets=[{"Id": "scheduler", "Arn": fn_arn}])

        with pytest.raises(NotImplementedError):  # moto cannot deliver to a Lambda target: the put fails
            _put(events, "JobPending", "moto-alone")
        assert seen == []

        with AsyncEventDelivery() as delivery:
            _put(events, "CapacityFreed", "j1")
            assert _wait(lambda: len(seen) == 1)
            assert seen[0] == {"fn": "scheduler", "type": "CapacityFreed", "job": "j1", "thread": delivery.thread_name}
            _put(events, "JobSucceeded", "ignored")  # the pattern does not match: nothing is invoked

            gate.clear()  # the function is busy with j2 while j3..j6 arrive
            _put(events, "JobPending", "j2")
            assert _wait(lambda: delivery.batches == 1 and not delivery._pending)
            for job in ("j3", "j4", "j5", "j6"):
                _put(events, "JobPending", job)
            gate.set()
            assert _wait(lambda: len(seen) == 3)
            time.sleep(0.3)
        assert [s["job"] for s in seen] == ["j1", "j2", "j6"]  # the burst while busy: one more, with the latest
        assert delivery.errors == 0 and delivery.invocations == 3
    assert not threading.enumerate().count(delivery._thread)  # stopped


def test_a_paced_function_waits_pace_times_its_last_invocation(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    spans: list[tuple[float, float, str]] = []

    def invoker(fn, event):
        began = time.monotonic()
        time.sleep(0.2)  # a pass over a backlog
        body = json.loads(event) if isinstance(event, str | bytes) else event
        spans.append((began, time.monotonic(), body["detail"]["job_id"]))
        return json.dumps({"ok": True}), False, ""

    with mock_aws(), patch_lambda(invoker):
        role = boto3.client("iam", region_name=REGION).create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        fn_arn = boto3.client("lambda", region_name=REGION).create_function(
            FunctionName="scheduler", Runtime="python3.11", Role=role, Handler="h.handler",
            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18})["FunctionArn"]
        events = boto3.client("events", region_name=REGION)
        events.create_event_bus(Name="bus")
        events.put_rule(Name="wake", EventBusName="bus",
                        EventPattern=json.dumps({"source": ["gpufleet"], "detail-type": ["JobPending"]}))
        events.put_targets(Rule="wake", EventBusName="bus", Targets=[{"Id": "scheduler", "Arn": fn_arn}])
        with pytest.raises(ValueError):
            AsyncEventDelivery(pace=-1)
        with AsyncEventDelivery(pace=2.0) as delivery:
            deadline = time.monotonic() + 2.5
            i = 0
            while time.monotonic() < deadline:  # a steady stream of events, 20 a second
                _put(events, "JobPending", f"j{i}")
                i += 1
                time.sleep(0.05)
            assert _wait(lambda: not delivery._pending, timeout=5)
            time.sleep(0.3)
    assert 2 <= len(spans) <= 7  # one every 0.6 s (0.2 s + 2 x 0.2 s); back to back ~14 in the same time
    for (_, ended, _), (began, _, _) in zip(spans, spans[1:], strict=False):
        assert began - ended >= 2.0 * 0.2 - 0.02  # pace x the last invocation's duration
    assert spans[-1][2] == f"j{i - 1}"  # what arrived meanwhile folded into the next invocation: the latest event
