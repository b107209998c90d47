"""Tenants fetch and rotate their webhook signing secrets through the API (KMS-sealed on moto)."""

from __future__ import annotations

import boto3
import pytest
from api_helpers import BOB, CAROL, REGION, Caller

from gpufleet.clock import FakeClock


@pytest.fixture
def settings_kw(aws):
    kms = boto3.client("kms", region_name=REGION)
    return {"webhook_key_id": kms.create_key(Description="webhook secrets")["KeyMetadata"]["Arn"]}


@pytest.fixture
def call(deps):
    from gpufleet.api.app import Api

    deps.kms = boto3.client("kms", region_name=REGION)
    deps.webhook_keys = None
    deps.__post_init__()
    return Caller(Api(deps))


def test_fetch_is_per_tenant_and_stable_and_never_plaintext_in_the_table(call, ddb, tables):
    first = call("GET", "/v1/webhooks/secrets")
    assert first.status == 200 and first.json["tenant"] == "t1"
    (secret,) = first.json["secrets"]
    assert secret["current"] and secret["secret"].startswith("whsec_") and secret["expires_at"] is None
    assert call("GET", "/v1/webhooks/secrets", arn=BOB).json["secrets"] == [secret]  # same tenant, same secret
    other = call("GET", "/v1/webhooks/secrets", arn=CAROL).json
    assert other["tenant"] == "t2" and other["secrets"][0]["secret"] != secret["secret"]
    item = ddb.get_item(TableName=tables.control, Key={"pk": {"S": "TENANT#t1"}, "sk": {"S": "TENANT"}})["Item"]
    assert secret["secret"][len("whsec_"):] not in str(item)


def test_rotation_keeps_the_old_secret_for_the_overlap_only(call, deps):
    old = call("GET", "/v1/webhooks/secrets").json["secrets"][0]
    rotated = call("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": 600})
    assert rotated.status == 200
    new, prev = rotated.json["secrets"]
    assert new["current"] and new["secret"] != old["secret"] and (prev["id"], prev["current"]) == (old["id"], False)
    assert prev["expires_at"] is not None
    assert isinstance(deps.clock, FakeClock)
    deps.clock.advance(601)
    assert [s["id"] for s in call("GET", "/v1/webhooks/secrets").json["secrets"]] == [new["id"]]


def test_bad_rotation_input_is_a_400(call):
    assert call("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": -1}).status == 400
    assert call("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": 10**9}).status == 400
    assert call("POST", "/v1/webhooks/secrets/rotate", {"surprise": 1}).status == 400


def test_a_receiver_verifies_deliveries_with_the_fetched_secrets_across_a_rotation(call, deps):
    """Issue 17's acceptance at the API: the secrets a tenant fetches verify what the sender signs (its signing
    secrets from the same store, signed as deliver_message signs); during a rotation's overlap either fetched
    secret verifies, after it only the new one."""
    from gpufleet.errors import Unauthorized
    from gpufleet.webhooks import delivery, signing

    body = b'{"type": "job.completed"}'

    def delivered() -> tuple[dict, float]:  # what the sender sends now
        now = float(deps.clock.now())
        return signing.headers(delivery.signing_secrets(deps.webhook_keys, "t1", now), "msg_1", int(now), body), now

    (old,) = [s["secret"] for s in call("GET", "/v1/webhooks/secrets").json["secrets"]]
    hdrs, now = delivered()
    signing.verify(old, hdrs, body, now=now)
    new, kept = [s["secret"] for s in call("POST", "/v1/webhooks/secrets/rotate", {"overlap_seconds": 600}).json["secrets"]]
    assert kept == old and new != old
    hdrs, now = delivered()
    for secret in (old, new):  # the overlap: a receiver holding either secret verifies
        signing.verify(secret, hdrs, body, now=now)
    deps.clock.advance(601)
    assert [s["secret"] for s in call("GET", "/v1/webhooks/secrets").json["secrets"]] == [new]
    hdrs, now = delivered()
    signing.verify(new, hdrs, body, now=now)
    with pytest.raises(Unauthorized):
        signing.verify(old, hdrs, body, now=now)
