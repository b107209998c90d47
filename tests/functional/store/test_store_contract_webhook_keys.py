"""Contract of :class:`gpufleet.store.webhook_keys.WebhookKeyStore` and its :class:`SecretBox`, on the fakes and on
moto (DynamoDB and KMS).

A tenant's signing secrets live sealed on its tenant item (never in plaintext); a sealed secret opens only for its
tenant. The first secret is stored only when the tenant has none (two racing first deliveries keep one); a
rotation lands only while the current secret is the one the caller read (:class:`Conflict` otherwise) and removes
a legacy plaintext ``webhook_secret``, which is read as the current secret (``whk_legacy``) until then.
"""

from __future__ import annotations

import pytest

from gpufleet.errors import Conflict, DependencyFailed
from gpufleet.store.webhook_keys import LEGACY_ID
from gpufleet.tables import TENANT_SK, tenant_pk
from gpufleet.webhooks.keys import WebhookKey

K1 = WebhookKey(id="whk_1", secret="whsec_one", created_at=1_780_000_000.0)
K2 = WebhookKey(id="whk_2", secret="whsec_two", created_at=1_780_000_100.5)


def _item(backend, tenant: str = "t1") -> dict:
    return backend.get_item("control", (tenant_pk(tenant), TENANT_SK)) or {}


def test_a_sealed_secret_opens_only_for_its_tenant(backend):
    sealed = backend.box.seal("t1", "whsec_x")
    assert "whsec_x" not in sealed
    assert backend.box.open("t1", sealed) == "whsec_x"
    with pytest.raises(DependencyFailed):
        backend.box.open("t2", sealed)


def test_the_first_secret_is_stored_once_and_sealed(backend):
    keys = backend.webhook_keys
    backend.set_attrs("control", (tenant_pk("t1"), TENANT_SK), {"placement_policy": "binpack"})
    assert keys.load("t1") == []
    assert keys.create_first("t1", K1) is True
    assert keys.create_first("t1", K2) is False  # a racing first delivery keeps the one stored
    assert keys.load("t1") == [K1]
    item = _item(backend)
    assert item["webhook_key_id"] == "whk_1" and item["placement_policy"] == "binpack"
    assert "whsec_one" not in repr(item)
    assert keys.create_first("t2", K2) is True and keys.load("t2") == [K2]  # a tenant without an item yet


def test_a_rotation_lands_only_over_the_secret_it_read(backend):
    keys = backend.webhook_keys
    keys.create_first("t1", K1)
    rotated = [K2, WebhookKey(K1.id, K1.secret, K1.created_at, expires_at=1_780_086_500.0)]
    keys.replace("t1", rotated, expected_current="whk_1")
    assert keys.load("t1") == rotated and _item(backend)["webhook_key_id"] == "whk_2"
    with pytest.raises(Conflict):  # another rotation read whk_1 too
        keys.replace("t1", [WebhookKey("whk_3", "whsec_three", 1.0)], expected_current="whk_1")
    with pytest.raises(Conflict):  # "no secret yet" is stale as well
        keys.replace("t1", [WebhookKey("whk_3", "whsec_three", 1.0)], expected_current=None)
    assert keys.load("t1") == rotated


def test_a_secret_copied_to_another_tenant_does_not_open(backend):
    backend.webhook_keys.create_first("t1", K1)
    item = _item(backend)
    backend.set_attrs("control", (tenant_pk("t2"), TENANT_SK), {k: item[k] for k in ("webhook_keys", "webhook_key_id")})
    with pytest.raises(DependencyFailed):
        backend.webhook_keys.load("t2")


def test_a_legacy_plaintext_secret_is_current_until_the_first_rotation(backend):
    keys = backend.webhook_keys
    backend.set_attrs("control", (tenant_pk("t1"), TENANT_SK), {"webhook_secret": "whsec_old"})
    legacy = WebhookKey(LEGACY_ID, "whsec_old", 0.0)
    assert keys.load("t1") == [legacy]
    assert keys.create_first("t1", K1) is False
    keys.replace(
        "t1", [K1, WebhookKey(LEGACY_ID, "whsec_old", 0.0, expires_at=1_780_086_400.0)], expected_current=LEGACY_ID
    )
    item = _item(backend)
    assert "webhook_secret" not in item and item["webhook_key_id"] == "whk_1"
    assert [k.id for k in keys.load("t1")] == ["whk_1", LEGACY_ID]
    with pytest.raises(Conflict):  # the legacy secret is no longer current
        keys.replace("t1", [K2], expected_current=LEGACY_ID)
