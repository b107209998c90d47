"""In-memory :class:`~gpufleet.store.secrets.SecretReader`: secrets by id, with the adapter's refusals (a missing
secret or one without a string value is a :class:`~gpufleet.errors.ConfigError` naming it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.errors import ConfigError


@dataclass
class MemorySecrets:
    #: secret id -> its current value (``bytes``: a binary secret, which has no string value)
    values: dict[str, str | bytes] = field(default_factory=dict)

    def put(self, secret_id: str, value: str | bytes) -> None:
        """Store ``value`` as the secret's new current version (what :func:`~gpufleet.store.secrets.put_secret_string`
        and ``aws secretsmanager put-secret-value`` do)."""
        self.values[secret_id] = value

    def read(self, secret_id: str) -> str:
        if secret_id not in self.values:
            raise ConfigError(f"cannot read secret {secret_id}: ResourceNotFoundException")
        value = self.values[secret_id]
        if not isinstance(value, str):
            raise ConfigError(f"secret {secret_id} holds no string value")
        return value
