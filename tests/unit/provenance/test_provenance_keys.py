"""Development signing credentials: created once in the state dir, C2PA-shaped, reused afterwards; the deployed
watermark secret's value."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpufleet.provenance.keys import dev_credentials


def test_dev_credentials_are_created_once_with_emailprotection_and_ee_first(tmp_path):
    creds = dev_credentials(tmp_path)
    again = dev_credentials(tmp_path)
    assert again == creds
    assert creds.private_key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    load_pem_private_key(creds.private_key_pem, password=None)
    chain = x509.load_pem_x509_certificates(creds.chain_pem)
    ee, ca = chain
    assert ee.issuer == ca.subject and ca.subject == ca.issuer
    eku = ee.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.EMAIL_PROTECTION in eku
    assert not ee.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert x509.load_pem_x509_certificate(creds.trust_anchor_pem) == ca
    mode = (tmp_path / "provenance" / "signer.key.pem").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_watermark_secret_round_trips_keys_in_order_and_derives_the_seed_key_last():
    import hashlib
    import json

    from gpufleet.provenance.keys import watermark_keys_from_secret, watermark_keys_to_secret
    from gpufleet.provenance.watermark import WatermarkKey

    current, old = WatermarkKey(b"\x01" * 32), WatermarkKey(b"\x02" * 32)
    assert watermark_keys_from_secret(watermark_keys_to_secret((current, old)), "s") == (current, old)
    seed = "A" * 64  # the template generates {"seed": <64 alphanumerics>}
    (derived,) = watermark_keys_from_secret(json.dumps({"seed": seed}), "s")
    assert derived.secret == hashlib.sha256(b"gpufleet-watermark-seed/" + seed.encode()).digest()
    both = watermark_keys_from_secret(json.dumps({"keys_hex": [current.secret.hex()], "seed": seed}), "s")
    assert both == (current, derived)  # an explicit key embeds; the deploy-time seed's key still detects


@pytest.mark.parametrize("value, why", [
    ("not json", "not JSON"),
    ("[]", "not a JSON object"),
    ("{}", "no key"),
    ('{"keys_hex": "ab"}', "not a list"),
    ('{"keys_hex": ["abcd"]}', "64 hex digits"),
    ('{"keys_hex": ["zz' + "0" * 62 + '"]}', "64 hex digits"),
    ('{"seed": "short"}', "at least 32"),
])
def test_an_unusable_watermark_secret_is_a_config_error_naming_the_secret_never_a_key(value, why):
    from gpufleet.errors import ConfigError
    from gpufleet.provenance.keys import watermark_keys_from_secret

    with pytest.raises(ConfigError, match=why) as err:
        watermark_keys_from_secret(value, "arn:secret:wm")
    assert "arn:secret:wm" in str(err.value) and "abcd" not in str(err.value)
