"""Secrets Manager reads (the one adapter for ``secretsmanager:GetSecretValue`` outside a Lambda entry point).

Contract:
- :class:`SecretReader` is the protocol: ``read(secret_id) -> str`` returns the secret's current
  ``SecretString``.
- :class:`SecretsManagerReader` implements it over a boto3 ``secretsmanager`` client. A missing secret,
  a denied read or a secret without a string value is a :class:`~gpufleet.errors.ConfigError` naming the
  secret (a deployment fault, never the tenant's: the runtime maps it to a system error); throttling, 5xx
  answers and unreachable endpoints are :class:`~gpufleet.errors.TransientError`.
- :func:`put_secret_string` stores a new current value (the local stack provisions its development
  credentials with it; operators use ``aws secretsmanager put-secret-value``).
"""

from __future__ import annotations

from typing import Protocol

from botocore.exceptions import ClientError

from gpufleet.errors import ConfigError, DependencyFailed
from gpufleet.store.dynamo import error_code, translate_errors

_DEPLOYMENT_FAULTS = ("ResourceNotFoundException", "AccessDeniedException", "AccessDenied",
                      "DecryptionFailure", "InvalidRequestException")


class SecretReader(Protocol):
    def read(self, secret_id: str) -> str: ...


class SecretsManagerReader:
    """:class:`SecretReader` over a ``secretsmanager`` client."""

    def __init__(self, client) -> None:
        self.client = client

    def read(self, secret_id: str) -> str:
        try:
            with translate_errors():
                resp = self.client.get_secret_value(SecretId=secret_id)
        except DependencyFailed as err:
            cause = err.__cause__
            code = error_code(cause) if isinstance(cause, ClientError) else ""
            if code in _DEPLOYMENT_FAULTS:
                raise ConfigError(f"cannot read secret {secret_id}: {code}") from err
            raise ConfigError(f"cannot read secret {secret_id}: {err.detail}") from err
        value = resp.get("SecretString")
        if value is None:
            raise ConfigError(f"secret {secret_id} holds no string value")
        return value


def put_secret_string(client, secret_id: str, value: str) -> None:
    """Store ``value`` as the secret's new current version."""
    with translate_errors():
        client.put_secret_value(SecretId=secret_id, SecretString=value)
