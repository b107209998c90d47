"""Provenance for generated media: invisible watermark, MP4 encoding, C2PA manifests, verification.

- :mod:`.watermark`: 48-bit ``dwtDctSvd`` payload derived from the job id; detection by majority vote.
- :mod:`.video`: MP4 (H.264, yuv420p) encode/decode with PyAV; frame resizing.
- :mod:`.keys`: development signing credentials (ES256) and a local trust anchor, created on first use.
- :mod:`.manifest`: the C2PA manifest (claim generator gpufleet, ``c2pa.created``,
  trainedAlgorithmicMedia, job id, model, prompt hash) and signing.
- :mod:`.verify`: :func:`verify(path, trust_anchors)` → C2PA state + recovered watermark.
"""

from gpufleet.provenance.verify import VerifyResult, verify

__all__ = ["VerifyResult", "verify"]
