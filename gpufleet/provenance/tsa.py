"""A small RFC 3161 time-stamp authority for development: the dev stack's trusted time for C2PA signatures.

Contract:
- :func:`dev_tsa(state_dir)` creates once, under ``<state_dir>/provenance/``, a TSA root
  (``tsa_root.pem``, a trust anchor to add beside the signing root) and a TSA certificate it issues
  (ECDSA P-256, extended key usage id-kp-timeStamping, critical); later calls reuse them.
- :meth:`TimeStampAuthority.respond(request_der)` answers a ``TimeStampReq`` with a granted
  ``TimeStampResp``: a CMS SignedData over a ``TSTInfo`` (policy :data:`POLICY`, the request's message
  imprint and nonce, a fresh serial, the current UTC time), with the signed attributes content type,
  message digest and ESS signing-certificate-v2, and the TSA certificate. A request that does not
  parse is answered ``rejection`` (status 2, badDataFormat).
- :class:`TsaServer` serves it over HTTP on 127.0.0.1 (``POST`` with
  ``application/timestamp-query``), in a daemon thread; ``url`` is what ``GPUFLEET_TSA_URL`` takes.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: the TSA policy OID of the development authority (a private arc: not a public policy)
POLICY = "1.3.6.1.4.1.57264.1.1"


@dataclass(frozen=True)
class TimeStampAuthority:
    key_pem: bytes
    cert_pem: bytes
    root_pem: bytes

    def respond(self, request_der: bytes) -> bytes:
        from asn1crypto import algos, cms, core, tsp, x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            req = tsp.TimeStampReq.load(request_der)
            imprint = req["message_imprint"]
            imprint.native  # noqa: B018 - parse it now: a malformed request is a rejection, not a crash
            nonce = req["nonce"].native
        except (ValueError, TypeError, KeyError):
            # TimeStampResp ::= SEQUENCE { status, timeStampToken OPTIONAL } (asn1crypto requires the token)
            status = tsp.PKIStatusInfo({"status": "rejection", "fail_info": {"bad_data_format"}}).dump()
            return b"\x30" + bytes([len(status)]) + status
        cert = x509.Certificate.load(_der(self.cert_pem))
        info = {"version": "v1", "policy": POLICY, "message_imprint": imprint,
                "serial_number": secrets.randbits(63), "gen_time": datetime.datetime.now(datetime.UTC),
                "accuracy": {"seconds": 1}}
        if nonce is not None:
            info["nonce"] = nonce
        tst = tsp.TSTInfo(info)
        content = tst.dump()
        attrs = cms.CMSAttributes([
            cms.CMSAttribute({"type": "content_type", "values": ["tst_info"]}),
            cms.CMSAttribute({"type": "message_digest", "values": [hashlib.sha256(content).digest()]}),
            cms.CMSAttribute({"type": "signing_certificate_v2", "values": [{"certs": [{
                "hash_algorithm": {"algorithm": "sha256"}, "cert_hash": hashlib.sha256(cert.dump()).digest(),
            }]}]}),
        ])
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        signature = key.sign(attrs.dump(), ec.ECDSA(hashes.SHA256()))
        signer = cms.SignerInfo({
            "version": "v1",
            "sid": cms.SignerIdentifier({"issuer_and_serial_number": cms.IssuerAndSerialNumber({
                "issuer": cert.issuer, "serial_number": cert.serial_number})}),
            "digest_algorithm": algos.DigestAlgorithm({"algorithm": "sha256"}),
            "signed_attrs": attrs,
            "signature_algorithm": algos.SignedDigestAlgorithm({"algorithm": "sha256_ecdsa"}),
            "signature": signature,
        })
        signed = cms.SignedData({
            "version": "v3",
            "digest_algorithms": [algos.DigestAlgorithm({"algorithm": "sha256"})],
            "encap_content_info": {"content_type": "tst_info", "content": core.ParsableOctetString(content)},
            "certificates": [cert],
            "signer_infos": [signer],
        })
        token = cms.ContentInfo({"content_type": "signed_data", "content": signed})
        return tsp.TimeStampResp({"status": {"status": "granted"}, "time_stamp_token": token}).dump()


def _der(pem: bytes) -> bytes:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem).public_bytes(encoding=__import__(
        "cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]).Encoding.DER)


def _generate() -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ku = dict(content_commitment=False, key_encipherment=False, data_encipherment=False, key_agreement=False,
              encipher_only=False, decipher_only=False)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet development TSA root"),
                           x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet (development)")])
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name)
            .public_key(root_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, key_cert_sign=True, crl_sign=True, **ku),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet development TSA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufleet (development)")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(root_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **ku),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key_pem, cert.public_bytes(pem), root.public_bytes(pem)


def dev_tsa(state_dir: str | os.PathLike) -> TimeStampAuthority:
    from gpufleet.provenance.keys import _write_atomic

    folder = Path(state_dir) / "provenance"
    key_path, cert_path, root_path = folder / "tsa.key.pem", folder / "tsa.pem", folder / "tsa_root.pem"
    if not (key_path.exists() and cert_path.exists() and root_path.exists()):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_pem, cert_pem, root_pem = _generate()
        _write_atomic(key_path, key_pem, 0o600)
        _write_atomic(cert_path, cert_pem)
        _write_atomic(root_path, root_pem)  # last: its presence marks a complete set
    return TimeStampAuthority(key_path.read_bytes(), cert_path.read_bytes(), root_path.read_bytes())


class TsaServer:
    """:class:`TimeStampAuthority` over HTTP on 127.0.0.1 (a daemon thread); ``url`` once started."""

    def __init__(self, tsa: TimeStampAuthority, port: int = 0) -> None:
        self.tsa = tsa
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = outer.tsa.respond(self.rfile.read(min(length, 64 * 1024)))
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/tsa"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> TsaServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
