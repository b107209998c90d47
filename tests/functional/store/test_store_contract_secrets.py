"""Contract of :class:`gpufleet.store.secrets.SecretReader`, on the fake and on moto (Secrets Manager).

``read`` returns the secret's current string value; a missing secret, or one that holds only a binary value, is a
:class:`ConfigError` naming the secret (a deployment fault).
"""

from __future__ import annotations

import pytest

from gpufleet.errors import ConfigError


def test_read_returns_the_current_value(backend):
    backend.put_secret("gpufleet/dev-creds", '{"user": "a"}')
    assert backend.secrets.read("gpufleet/dev-creds") == '{"user": "a"}'
    backend.put_secret("gpufleet/dev-creds", '{"user": "b"}')
    assert backend.secrets.read("gpufleet/dev-creds") == '{"user": "b"}'


def test_a_missing_or_binary_secret_is_a_config_error_naming_it(backend):
    with pytest.raises(ConfigError, match="gpufleet/nope"):
        backend.secrets.read("gpufleet/nope")
    backend.put_secret("gpufleet/binary", b"\x00\x01")
    with pytest.raises(ConfigError, match="gpufleet/binary.*no string value"):
        backend.secrets.read("gpufleet/binary")
