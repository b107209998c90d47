"""Invisible watermark: a 48-bit payload derived from the job id, embedded with ``dwtDctSvd``.

Contract:
- :func:`payload_for_job` = the first 6 bytes of SHA-256(job id), as 48 bits
  (MSB first); :func:`payload_hex` is its 12-hex-digit form.
- :func:`embed` marks every frame (uint8 RGB, each side ≥ 256 px, else
  :class:`gpufleet.errors.ValidationFailed`).
- :func:`detect` decodes every frame and takes a per-bit majority vote; it
  returns the recovered payload and the per-frame votes. ``dwtDctSvd``
  survives H.264 at the CRF used by :mod:`gpufleet.provenance.video`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from gpufleet.errors import ValidationFailed

PAYLOAD_BITS = 48
MIN_SIDE = 256
METHOD = "dwtDctSvd"


def payload_for_job(job_id: str) -> list[int]:
    raw = hashlib.sha256(job_id.encode()).digest()[: PAYLOAD_BITS // 8]
    return [int(b) for b in np.unpackbits(np.frombuffer(raw, dtype=np.uint8))]


def bits_to_hex(bits: list[int] | np.ndarray) -> str:
    return np.packbits(np.asarray(bits, dtype=np.uint8)).tobytes().hex()


def payload_hex(job_id: str) -> str:
    return bits_to_hex(payload_for_job(job_id))


def _check(frames: np.ndarray) -> None:
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValidationFailed("frames must be uint8 RGB with shape (n, height, width, 3)")
    if min(frames.shape[1:3]) < MIN_SIDE:
        raise ValidationFailed(f"the watermark needs frames of at least {MIN_SIDE}x{MIN_SIDE}")


def embed(frames: np.ndarray, bits: list[int]) -> np.ndarray:
    from imwatermark import WatermarkEncoder

    _check(frames)
    enc = WatermarkEncoder()
    enc.set_watermark("bits", list(bits))
    # imwatermark works on BGR images (OpenCV order).
    return np.stack([enc.encode(np.ascontiguousarray(f[:, :, ::-1]), METHOD)[:, :, ::-1] for f in frames])


@dataclass(frozen=True)
class Detection:
    bits: list[int]
    votes: np.ndarray  # (frames, 48) of 0/1

    @property
    def hex(self) -> str:
        return bits_to_hex(self.bits)

    def matches(self, expected: list[int]) -> int:
        return int(sum(int(a == b) for a, b in zip(self.bits, expected, strict=True)))


def detect(frames: np.ndarray) -> Detection:
    from imwatermark import WatermarkDecoder

    _check(frames)
    dec = WatermarkDecoder("bits", PAYLOAD_BITS)
    votes = np.array([np.asarray(dec.decode(np.ascontiguousarray(f[:, :, ::-1]), METHOD), dtype=np.uint8)
                      for f in frames])
    bits = (votes.mean(axis=0) > 0.5).astype(int).tolist()
    return Detection(bits, votes)
