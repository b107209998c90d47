"""Development signing credentials: created once in the state dir, C2PA-shaped, reused afterwards."""

from __future__ import annotations

import stat

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
