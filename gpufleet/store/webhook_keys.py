"""Tenants' webhook signing secrets, encrypted with a KMS key, on the tenant item (control table).

Item: ``TENANT#<tenant>`` / ``TENANT`` holds ``webhook_keys`` (a list of ``{id, sealed, created_at,
expires_at}``; ``sealed`` is the base64 KMS ciphertext of the ``whsec_…`` secret, encrypted under
``GPUFLEET_WEBHOOK_KEY_ID`` with the encryption context ``{"gpufleet:tenant": <tenant>, "gpufleet:purpose":
"webhook-signing"}``, so a ciphertext copied to another tenant's item does not decrypt) and
``webhook_key_id`` (the current secret's id: the condition of every change). No secret is ever stored in
plaintext. A plaintext ``webhook_secret`` written by an earlier version is read as the current secret
(id ``whk_legacy``) until the first rotation, which removes it.

Contract:
- :meth:`WebhookKeyStore.load` returns the tenant's secrets, decrypted (empty: none yet).
- :meth:`WebhookKeyStore.create_first` stores a first secret only if the tenant has none (two first
  deliveries racing keep one) and says whether it did.
- :meth:`WebhookKeyStore.replace` stores a rotation's keys only if the current secret is still
  ``expected_current`` (:class:`~gpufleet.errors.Conflict` otherwise: another rotation won).
- AWS errors (DynamoDB, KMS) become :mod:`gpufleet.errors` exceptions.
"""

from __future__ import annotations

import base64
from typing import Any, Protocol

from gpufleet.errors import Conflict
from gpufleet.store.dynamo import conditional_write, marshal, marshal_value, translate_errors, unmarshal
from gpufleet.tables import TENANT_SK, tenant_pk
from gpufleet.webhooks.keys import WebhookKey

LEGACY_ID = "whk_legacy"


class SecretBox(Protocol):
    def seal(self, tenant: str, plaintext: str) -> str: ...

    def open(self, tenant: str, sealed: str) -> str: ...


class KmsSecretBox:
    """:class:`SecretBox` over a KMS key (``kms:Encrypt`` / ``kms:Decrypt`` with the tenant's encryption context)."""

    def __init__(self, kms, key_id: str) -> None:
        self.kms = kms
        self.key_id = key_id

    @staticmethod
    def context(tenant: str) -> dict[str, str]:
        return {"gpufleet:tenant": tenant, "gpufleet:purpose": "webhook-signing"}

    def seal(self, tenant: str, plaintext: str) -> str:
        with translate_errors():
            blob = self.kms.encrypt(KeyId=self.key_id, Plaintext=plaintext.encode(),
                                    EncryptionContext=self.context(tenant))["CiphertextBlob"]
        return base64.b64encode(blob).decode()

    def open(self, tenant: str, sealed: str) -> str:
        with translate_errors():
            out = self.kms.decrypt(KeyId=self.key_id, CiphertextBlob=base64.b64decode(sealed),
                                   EncryptionContext=self.context(tenant))["Plaintext"]
        return out.decode()


def keys_of(box: SecretBox, tenant: str, item: dict[str, Any]) -> list[WebhookKey]:
    """The secrets a tenant item holds, opened by ``box`` (a legacy plaintext ``webhook_secret`` when it has none)."""
    keys = [WebhookKey(id=str(k["id"]), secret=box.open(tenant, str(k["sealed"])), created_at=float(k["created_at"]),
                       expires_at=float(k["expires_at"]) if k.get("expires_at") is not None else None)
            for k in item.get("webhook_keys") or []]
    if not keys and item.get("webhook_secret"):
        keys = [WebhookKey(id=LEGACY_ID, secret=str(item["webhook_secret"]), created_at=0.0)]
    return keys


def sealed(box: SecretBox, tenant: str, keys: list[WebhookKey]) -> list[dict[str, Any]]:
    """``keys`` as the item stores them (``webhook_keys``): each secret sealed by ``box``."""
    return [{"id": k.id, "sealed": box.seal(tenant, k.secret), "created_at": k.created_at,
             "expires_at": k.expires_at} for k in keys]


def current_id(keys: list[WebhookKey]) -> str:
    """The id a rotation's keys make current (``webhook_key_id``): the one that does not expire."""
    return next(k.id for k in keys if k.expires_at is None)


def rotation_lost(tenant: str) -> Conflict:
    return Conflict(f"the webhook secrets of tenant {tenant} changed meanwhile (another rotation)")


class WebhookKeyStore(Protocol):
    def load(self, tenant: str) -> list[WebhookKey]: ...

    def create_first(self, tenant: str, key: WebhookKey) -> bool: ...

    def replace(self, tenant: str, keys: list[WebhookKey], expected_current: str | None) -> None: ...


class DynamoWebhookKeys:
    """:class:`WebhookKeyStore` on the control table's tenant items, sealed by ``box``."""

    def __init__(self, client, table: str, box: SecretBox) -> None:
        self.client = client
        self.table = table
        self.box = box

    def _key(self, tenant: str) -> dict[str, Any]:
        return marshal({"pk": tenant_pk(tenant), "sk": TENANT_SK})

    def load(self, tenant: str) -> list[WebhookKey]:
        with translate_errors():
            got = self.client.get_item(TableName=self.table, Key=self._key(tenant), ConsistentRead=True,
                                       ProjectionExpression="webhook_keys, webhook_secret")
        return keys_of(self.box, tenant, unmarshal(got.get("Item")) or {})

    def create_first(self, tenant: str, key: WebhookKey) -> bool:
        return conditional_write(
            self.client.update_item, TableName=self.table, Key=self._key(tenant),
            UpdateExpression="SET webhook_keys = :k, webhook_key_id = :i",
            ConditionExpression="attribute_not_exists(webhook_key_id) AND attribute_not_exists(webhook_secret)",
            ExpressionAttributeValues={":k": marshal_value(sealed(self.box, tenant, [key])), ":i": {"S": key.id}},
        ) is not None

    def replace(self, tenant: str, keys: list[WebhookKey], expected_current: str | None) -> None:
        current = current_id(keys)
        if expected_current in (None, LEGACY_ID):
            cond, values = "attribute_not_exists(webhook_key_id)", {}
        else:
            cond, values = "webhook_key_id = :e", {":e": {"S": expected_current}}
        done = conditional_write(
            self.client.update_item, TableName=self.table, Key=self._key(tenant),
            UpdateExpression="SET webhook_keys = :k, webhook_key_id = :i REMOVE webhook_secret",
            ConditionExpression=cond,
            ExpressionAttributeValues={":k": marshal_value(sealed(self.box, tenant, keys)), ":i": {"S": current},
                                       **values},
        )
        if done is None:
            raise rotation_lost(tenant)
