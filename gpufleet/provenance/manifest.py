"""The C2PA manifest of a generated video, and signing it into the MP4.

Contract: :func:`build_manifest` returns the manifest definition (claim
generator ``gpufleet``; one ``c2pa.actions`` assertion with ``c2pa.created``,
digital source type trainedAlgorithmicMedia and parameters ``job_id``,
``model``, ``model_hash``, ``prompt_sha256``; plus a ``org.gpufleet.job``
assertion with the watermark method, payload and key id). :func:`sign_mp4` embeds it into the
MP4, signed ES256 with the given credentials — time-stamped by the RFC 3161
time-stamp authority at ``tsa_url`` when one is configured — and returns (signed
MP4 bytes, manifest store bytes). Raises :class:`gpufleet.errors.ConfigError` when
signing fails (bad key or chain).
"""

from __future__ import annotations

import io
import json
from typing import Any

from gpufleet import __version__ as GPUFLEET_VERSION
from gpufleet.errors import ConfigError
from gpufleet.provenance.keys import SigningCredentials
from gpufleet.provenance.watermark import METHOD, PAYLOAD_BITS

TRAINED_ALGORITHMIC_MEDIA = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
CLAIM_GENERATOR = "gpufleet"


def build_manifest(*, job_id: str, model: str, model_hash: str, prompt_sha256: str, watermark_payload: str,
                   watermark_key_id: str, title: str = "video.mp4") -> dict[str, Any]:
    return {
        "claim_generator_info": [{"name": CLAIM_GENERATOR, "version": GPUFLEET_VERSION}],
        "title": title,
        "format": "video/mp4",
        "assertions": [
            {"label": "c2pa.actions", "data": {"actions": [{
                "action": "c2pa.created",
                "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA,
                "softwareAgent": {"name": CLAIM_GENERATOR, "version": GPUFLEET_VERSION},
                "parameters": {"job_id": job_id, "model": model, "model_hash": model_hash,
                               "prompt_sha256": prompt_sha256},
            }]}},
            {"label": "org.gpufleet.job", "data": {"job_id": job_id, "watermark": {
                "method": METHOD, "bits": PAYLOAD_BITS, "payload": watermark_payload, "key_id": watermark_key_id}}},
        ],
    }


def sign_mp4(mp4: bytes, manifest: dict[str, Any], creds: SigningCredentials,
             tsa_url: str | None = None) -> tuple[bytes, bytes]:
    import c2pa

    try:
        info = c2pa.C2paSignerInfo(alg=b"es256", sign_cert=creds.chain_pem, private_key=creds.private_key_pem,
                                   ta_url=tsa_url.encode() if tsa_url else None)
        signer = c2pa.Signer.from_info(info)
        builder = c2pa.Builder(json.dumps(manifest))
        out = io.BytesIO()
        store = builder.sign(signer, "video/mp4", io.BytesIO(mp4), out)
    except c2pa.C2paError as err:
        raise ConfigError(f"C2PA signing failed: {err}")
    return out.getvalue(), bytes(store)
