"""Provenance for generated media: invisible watermark, MP4 encoding, C2PA manifests, verification.

- :mod:`.watermark`: keyed spread-spectrum watermark (48-bit payload from the job id, Reed–Solomon
  coded, embedded under a platform secret; detection with sync search over scale/shift/crop/flip).
- :mod:`.robustness`: procedural test clips and the transforms the watermark is measured against.
- :mod:`.video`: MP4 (H.264, yuv420p) encode/decode with PyAV; frame resizing.
- :mod:`.keys`: development signing credentials (ES256), a local trust anchor and watermark keys.
- :mod:`.manifest`: the C2PA manifest (claim generator gpufleet, ``c2pa.created``,
  trainedAlgorithmicMedia, job id, model, prompt hash) and signing.
- :mod:`.verify`: :func:`verify(path, trust_anchors, watermark_keys)` → C2PA state + recovered watermark.
"""

from gpufleet.provenance.verify import VerifyResult, verify

__all__ = ["VerifyResult", "verify"]
