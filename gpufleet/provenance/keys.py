"""C2PA signing credentials: configured, or development ones generated on first use.

Contract:
- :class:`SigningCredentials` holds a PKCS#8 PEM private key (ES256, P-256)
  and a PEM chain, end-entity first. The end-entity certificate carries the
  emailProtection extended key usage and digitalSignature key usage, as C2PA
  requires.
- :func:`dev_credentials(state_dir)` creates, once, a development root CA
  (the local trust anchor, ``trust_anchor.pem``) and an end-entity signer
  under ``<state_dir>/provenance/`` (key file mode 0600; files written to a
  temp name, then renamed). Later calls reuse them. They are never committed:
  the state dir lives outside the repository (``~/.local/state/gpufleet`` by default).
- :func:`load_credentials(key_path, chain_path)` reads configured ones.
- :func:`credentials_from_secret(text, secret_id)` parses the production form: the JSON value of a
  Secrets Manager secret, ``{"private_key_pem": ..., "chain_pem": ...}`` (optionally
  ``"trust_anchor_pem"``). The key must be an EC P-256 private key, the chain one or more PEM
  certificates, and the first certificate's public key must be the key's; anything else is a
  :class:`~gpufleet.errors.ConfigError` naming the secret and what is wrong (never the key material).
  :func:`credentials_to_secret` is the inverse (the local stack provisions its development credentials
  with it).
- Watermark keys (:class:`gpufleet.provenance.watermark.WatermarkKey`): a key file holds one
  secret per line as 64 hex digits; the first line is the current key (embedding), every line is
  tried when detecting (rotation). :func:`load_watermark_keys(path)` reads one;
  :func:`dev_watermark_keys(state_dir)` creates ``<state_dir>/provenance/watermark.keys`` (mode
  0600, 32 random bytes) once — never replaced, a concurrent creator's key wins — and reads it.
- Deployed stacks keep the watermark keys in a Secrets Manager secret (the template's ``WatermarkSecret``, read by
  the finalize roles and the API's lookup): :func:`watermark_keys_from_secret(text, secret_id)` reads its JSON value,
  ``{"keys_hex": [<64 hex digits>, ...], "seed": <string of 32+ characters>}`` (either or both): the ``keys_hex``
  keys in order, then the key derived from ``seed`` (SHA-256 of ``gpufleet-watermark-seed/`` + the seed; the
  template generates a random 64-character seed at deploy, so a new stack embeds under a key of its own with no
  operator step); the first key embeds, every key is tried when detecting. Rotation: put the new key first in
  ``keys_hex`` and keep the old ones after it. Anything else is a ConfigError naming the secret (never a key).
  :func:`watermark_keys_to_secret` writes the ``keys_hex`` form (the local stack provisions its development key).
"""

from __future__ import annotations

import datetime
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import ConfigError, ValidationFailed
from gpufleet.provenance.watermark import WatermarkKey


@dataclass(frozen=True)
class SigningCredentials:
    private_key_pem: bytes
    chain_pem: bytes
    trust_anchor_pem: bytes | None = None


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _generate() -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet development root"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet (development)")])
    ku = dict(content_commitment=False, key_encipherment=False, data_encipherment=False, key_agreement=False,
              encipher_only=False, decipher_only=False)
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, key_cert_sign=True, crl_sign=True, **ku), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    ee_key = ec.generate_private_key(ec.SECP256R1())
    ee_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet development signer"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet (development)")])
    ee = (x509.CertificateBuilder().subject_name(ee_name).issuer_name(ca_name).public_key(ee_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
          .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **ku), critical=True)
          .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ee_key.public_key()), critical=False)
          .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = ee_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key_pem, ee.public_bytes(pem) + ca.public_bytes(pem), ca.public_bytes(pem)


def dev_credentials(state_dir: str | os.PathLike) -> SigningCredentials:
    folder = Path(state_dir) / "provenance"
    key_path, chain_path, anchor_path = folder / "signer.key.pem", folder / "chain.pem", folder / "trust_anchor.pem"
    if not (key_path.exists() and chain_path.exists() and anchor_path.exists()):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_pem, chain_pem, anchor_pem = _generate()
        # The anchor is written last: its presence marks a complete set.
        _write_atomic(key_path, key_pem, 0o600)
        _write_atomic(chain_path, chain_pem)
        _write_atomic(anchor_path, anchor_pem)
    return SigningCredentials(key_path.read_bytes(), chain_path.read_bytes(), anchor_path.read_bytes())


def load_credentials(key_path: str, chain_path: str) -> SigningCredentials:
    try:
        return SigningCredentials(Path(key_path).read_bytes(), Path(chain_path).read_bytes())
    except OSError as err:
        raise ConfigError(f"cannot read signing credentials: {err}")


def credentials_to_secret(creds: SigningCredentials) -> str:
    """The JSON secret value :func:`credentials_from_secret` reads."""
    import json

    value = {"private_key_pem": creds.private_key_pem.decode(), "chain_pem": creds.chain_pem.decode()}
    if creds.trust_anchor_pem:
        value["trust_anchor_pem"] = creds.trust_anchor_pem.decode()
    return json.dumps(value)


def credentials_from_secret(text: str, secret_id: str) -> SigningCredentials:
    """Signing credentials from a secret's JSON value (module docstring); ConfigError when unusable."""
    import json

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def bad(why: str) -> ConfigError:
        return ConfigError(f"signing secret {secret_id}: {why}; store {{\"private_key_pem\": <PKCS#8 PEM ES256 key>, "
                           "\"chain_pem\": <PEM chain, end-entity first>}} (docs/operations.md, \"Provenance keys\")")

    try:
        value = json.loads(text)
    except ValueError:
        raise bad("the value is not JSON (still the placeholder the template generated?)")
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("private_key_pem", "chain_pem")):
        raise bad("private_key_pem and chain_pem are missing")
    key_pem, chain_pem = value["private_key_pem"].encode(), value["chain_pem"].encode()
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise bad("private_key_pem is not an unencrypted PEM private key")
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise bad("the key is not an EC P-256 key (C2PA ES256)")
    try:
        certs = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        raise bad("chain_pem holds no PEM certificate")
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if certs[0].public_key().public_bytes(serialization.Encoding.PEM, public) != key.public_key().public_bytes(
            serialization.Encoding.PEM, public):
        raise bad("the chain's first certificate is not the key's")
    anchor = value.get("trust_anchor_pem")
    return SigningCredentials(key_pem, chain_pem, anchor.encode() if isinstance(anchor, str) else None)


def load_watermark_keys(path: str | os.PathLike) -> tuple[WatermarkKey, ...]:
    try:
        lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
        found = tuple(WatermarkKey(bytes.fromhex(ln)) for ln in lines)
    except OSError as err:
        raise ConfigError(f"cannot read watermark keys {path}: {err.strerror}")
    except (ValueError, ValidationFailed):
        raise ConfigError(f"watermark keys {path}: each line must be 64 hex digits")
    if not found:
        raise ConfigError(f"watermark keys {path}: no key")
    return found


def dev_watermark_keys(state_dir: str | os.PathLike) -> tuple[WatermarkKey, ...]:
    path = watermark_keys_path(state_dir)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            os.write(fd, (os.urandom(32).hex() + "\n").encode())
            os.fchmod(fd, 0o600)
            os.close(fd)
            os.link(tmp, path)  # create-if-absent: a concurrent creator's key wins, never replaced
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return load_watermark_keys(path)


SEED_CONTEXT = b"gpufleet-watermark-seed/"


def watermark_keys_to_secret(found: tuple[WatermarkKey, ...]) -> str:
    """The JSON secret value :func:`watermark_keys_from_secret` reads (the ``keys_hex`` form)."""
    import json

    return json.dumps({"keys_hex": [k.secret.hex() for k in found]})


def watermark_keys_from_secret(text: str, secret_id: str) -> tuple[WatermarkKey, ...]:
    """Watermark keys from a secret's JSON value (module docstring); ConfigError when unusable."""
    import hashlib
    import json

    def bad(why: str) -> ConfigError:
        return ConfigError(f"watermark secret {secret_id}: {why}; store {{\"keys_hex\": [<64 hex digits>, ...]}} "
                           "or {\"seed\": <32+ characters>} (docs/operations.md, \"Provenance keys\")")

    try:
        value = json.loads(text)
    except ValueError:
        raise bad("the value is not JSON")
    if not isinstance(value, dict):
        raise bad("the value is not a JSON object")
    hexes, seed = value.get("keys_hex", []), value.get("seed")
    if not isinstance(hexes, list) or not all(isinstance(h, str) for h in hexes):
        raise bad("keys_hex is not a list of strings")
    if seed is not None and (not isinstance(seed, str) or len(seed) < 32):
        raise bad("seed is not a string of at least 32 characters")
    try:
        found = [WatermarkKey(bytes.fromhex(h)) for h in hexes]
    except (ValueError, ValidationFailed):
        raise bad("each keys_hex entry must be 64 hex digits")
    if seed is not None:
        found.append(WatermarkKey(hashlib.sha256(SEED_CONTEXT + seed.encode()).digest()))
    if not found:
        raise bad("no key")
    return tuple(found)


def watermark_keys_path(state_dir: str | os.PathLike) -> Path:
    """Where :func:`dev_watermark_keys` keeps the development watermark key file."""
    return Path(state_dir) / "provenance" / "watermark.keys"
