"""Verify a delivered video: C2PA validation state and the recovered watermark.

Contract: :func:`verify(path, trust_anchors, watermark_keys)` reads the MP4 at ``path`` (or
bytes) and returns :class:`VerifyResult`:
- ``c2pa_state``: ``"Trusted"`` (valid and chained to one of the PEM
  ``trust_anchors``), ``"Valid"`` (intact, signer not trusted), ``"Invalid"``
  (hash or signature failure, e.g. a flipped byte), or ``"None"`` (no manifest);
- with ``watermark_keys`` (the platform's secrets): ``watermark_payload`` (12 hex
  digits) when :func:`gpufleet.provenance.watermark.detect` finds a *valid* mark,
  its ``watermark_key_id`` and ``watermark_confidence`` (share of coded bits read
  right); without keys, or with no valid mark, ``watermark_payload`` is None and
  ``watermark_checked`` says whether a key was there to look with;
- ``job_id`` / ``manifest`` from the active manifest when readable.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.provenance.watermark import WatermarkKey


@dataclass
class VerifyResult:
    c2pa_state: str
    watermark_payload: str | None
    watermark_confidence: float
    job_id: str | None = None
    watermark_checked: bool = False
    watermark_key_id: str | None = None
    manifest: dict[str, Any] | None = None
    failures: list[str] = field(default_factory=list)


def _read_c2pa(data: bytes, trust_anchors: str | bytes | None) -> tuple[str, dict | None, list[str]]:
    import c2pa

    anchors = trust_anchors.decode() if isinstance(trust_anchors, bytes) else trust_anchors
    settings: dict[str, Any] = {"verify": {"verify_trust": bool(anchors)}}
    if anchors:
        settings["trust"] = {"trust_anchors": anchors}
    ctx = c2pa.Context(c2pa.Settings.from_dict(settings))
    try:
        reader = c2pa.Reader("video/mp4", io.BytesIO(data), context=ctx)
    except c2pa.C2paError as err:
        if "ManifestNotFound" in type(err).__name__ or "not found" in str(err).lower():
            return "None", None, []
        return "Invalid", None, [str(err)]
    state = reader.get_validation_state() or "None"
    results = reader.get_validation_results() or {}
    failures = [f.get("code", "") for f in (results.get("activeManifest") or {}).get("failure", [])]
    return state, reader.get_active_manifest(), failures


def _job_id(manifest: dict | None) -> str | None:
    for a in (manifest or {}).get("assertions", []):
        if a.get("label") == "org.gpufleet.job":
            return a.get("data", {}).get("job_id")
    return None


def verify(path: str | os.PathLike | bytes, trust_anchors: str | bytes | None = None,
           watermark_keys: Sequence[WatermarkKey] = ()) -> VerifyResult:
    from gpufleet.provenance.video import decode_mp4
    from gpufleet.provenance.watermark import detect

    data = path if isinstance(path, bytes) else Path(path).read_bytes()
    state, manifest, failures = _read_c2pa(data, trust_anchors)
    result = VerifyResult(state, None, 0.0, _job_id(manifest), watermark_checked=bool(watermark_keys),
                          manifest=manifest, failures=failures)
    if not watermark_keys:
        return result
    try:
        found = detect(decode_mp4(data), list(watermark_keys))
    except Exception as err:  # undecodable media: report no watermark rather than fail verification
        failures.append(f"watermark: {type(err).__name__}: {err}")
        return result
    if found.valid:
        result.watermark_payload, result.watermark_key_id = found.hex, found.key_id
        result.watermark_confidence = found.confidence
    else:
        failures.append(f"watermark: no valid mark (sync z {found.sync_z:.1f})")
    return result
