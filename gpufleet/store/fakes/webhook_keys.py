"""In-memory :class:`~gpufleet.store.webhook_keys.WebhookKeyStore` and :class:`~gpufleet.store.webhook_keys.SecretBox`.

:class:`MemoryWebhookKeys` keeps the tenant item (``TENANT#<tenant>`` / ``TENANT``) as the DynamoDB store does,
through its own pieces (:func:`~gpufleet.store.webhook_keys.sealed`, :func:`~gpufleet.store.webhook_keys.keys_of`,
:func:`~gpufleet.store.webhook_keys.current_id`) and with its conditions: a first secret only when the tenant has
none (neither ``webhook_key_id`` nor a legacy ``webhook_secret``); a rotation only while the current secret is
still the one the caller read, else :class:`~gpufleet.errors.Conflict`; a rotation removes the legacy secret.

:class:`MemorySecretBox` seals like KMS with the tenant's encryption context: the sealed text is an opaque
base64 token, never the secret, and it opens only for the tenant it was sealed for (another tenant's, or an
unknown token, is :class:`~gpufleet.errors.DependencyFailed`, as the KMS adapter maps
``InvalidCiphertextException``).
"""

from __future__ import annotations

import base64
import secrets
import threading
from dataclasses import dataclass, field

from gpufleet.errors import DependencyFailed
from gpufleet.store.dynamo import marshal, unmarshal
from gpufleet.store.fakes.memory import MemoryDatabase
from gpufleet.store.webhook_keys import LEGACY_ID, SecretBox, current_id, keys_of, rotation_lost, sealed
from gpufleet.tables import TENANT_SK, tenant_pk
from gpufleet.webhooks.keys import WebhookKey


@dataclass
class MemorySecretBox:
    _sealed: dict[str, tuple[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def seal(self, tenant: str, plaintext: str) -> str:
        token = base64.b64encode(secrets.token_bytes(48)).decode()
        with self._lock:
            self._sealed[token] = (tenant, plaintext)
        return token

    def open(self, tenant: str, sealed: str) -> str:
        with self._lock:
            found = self._sealed.get(sealed)
        if found is None or found[0] != tenant:
            raise DependencyFailed("InvalidCiphertextException: the ciphertext does not open in this context")
        return found[1]


@dataclass
class MemoryWebhookKeys:
    db: MemoryDatabase
    box: SecretBox
    table: str = "control"

    def _item(self, tenant: str) -> dict:
        return self.db.get(self.table, (tenant_pk(tenant), TENANT_SK)) or {"pk": tenant_pk(tenant), "sk": TENANT_SK}

    def load(self, tenant: str) -> list[WebhookKey]:
        return keys_of(self.box, tenant, self._item(tenant))

    def _store(self, item: dict) -> None:
        self.db.put(self.table, unmarshal(marshal(item)) or {})  # as DynamoDB gives it back

    def create_first(self, tenant: str, key: WebhookKey) -> bool:
        stored = sealed(self.box, tenant, [key])
        with self.db.lock:
            item = self._item(tenant)
            if "webhook_key_id" in item or "webhook_secret" in item:
                return False
            self._store({**item, "webhook_keys": stored, "webhook_key_id": key.id})
            return True

    def replace(self, tenant: str, keys: list[WebhookKey], expected_current: str | None) -> None:
        current, stored = current_id(keys), sealed(self.box, tenant, keys)
        with self.db.lock:
            item = self._item(tenant)
            if expected_current in (None, LEGACY_ID):
                ok = "webhook_key_id" not in item
            else:
                ok = item.get("webhook_key_id") == expected_current
            if not ok:
                raise rotation_lost(tenant)
            item.pop("webhook_secret", None)
            self._store({**item, "webhook_keys": stored, "webhook_key_id": current})
