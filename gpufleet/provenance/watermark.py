"""Keyed, robust invisible watermark: a 48-bit payload spread over the luma under a platform secret.

Contract:
- :func:`payload_for_job` = the first 6 bytes of SHA-256(job id), as 48 bits
  (MSB first); :func:`payload_hex` is its 12-hex-digit form. The payload is not
  secret; what makes a mark genuine is the key it was embedded under.
- :class:`WatermarkKey` is a 32-byte secret and its public ``key_id`` (the first
  16 hex digits of SHA-256("gpufleet-watermark-key-id" ‖ secret)), recorded in
  the C2PA manifest. :mod:`gpufleet.provenance.wmkeys` loads or creates them.
- :func:`embed(frames, bits, key)` codes the 48 bits with Reed–Solomon (6 data
  + 10 parity bytes: 128 coded bits, up to 5 byte errors or 10 erasures
  corrected) and adds to every frame, equally on R, G and B (so only luma
  changes), a key-derived pattern: a canvas of 4-px cells, each cell a keyed
  ±1 chip; a keyed quarter of the cells is a *sync* pattern, every other cell
  carries one coded bit (keyed, interleaved assignment) as chip × (±1). The
  pattern is smoothed (Gaussian, σ 1 px) and its amplitude follows local
  texture (:data:`STRENGTH` on flat areas, up to 2.5× on busy ones).
- :func:`detect(frames, keys)` (or :func:`detect_luma` on :func:`mean_luma`'s plane) rescales frames whose shorter side is under
  :data:`MIN_SIDE`, averages luma over frames, whitens it (minus a Gaussian
  blur, divided by local contrast) and, for each key, for each candidate scale
  (:data:`SCALES`) and for the frame and its mirror, cross-correlates it with
  the sync pattern over offsets up to 20 % of the frame (+16 px) by FFT: that
  finds crops, shifts, 0.5× scalings and horizontal flips. At the best offset
  it soft-decodes every coded bit (sum of chip × residual over its cells) and
  decodes Reed–Solomon, marking the least confident bytes as erasures when
  plain decoding fails (at most 4, so parity is left to check the decode). The result is *valid* only when the sync peak stands
  :data:`SYNC_Z` robust standard deviations above the correlation surface and
  Reed–Solomon decodes: without the key the sync pattern and chips are
  unknown, so a stamped or wrong-key mark correlates at chance.
- numpy only (and ``reedsolo``): it runs where OpenCV cannot, e.g. the API Lambda.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass, field

import numpy as np

from gpufleet.errors import ValidationFailed
from gpufleet.finalize_route import MIN_SIDE as _MIN_SIDE

PAYLOAD_BITS = 48
PAYLOAD_BYTES = PAYLOAD_BITS // 8
PARITY_BYTES = 10
CODED_BITS = (PAYLOAD_BYTES + PARITY_BYTES) * 8
MIN_SIDE = _MIN_SIDE  # the delivered size's minimum side (gpufleet.finalize_route)
METHOD = "gpufleet-keyed-ss-v1"
CELL = 4  # pixels per pattern cell at the delivery scale
CANVAS_CELLS = 512  # the pattern repeats every 2048 px
SYNC_SHARE = 0.25
STRENGTH = 2.0  # luma levels on flat areas
SMOOTH_SIGMA = 1.0
#: candidate rescalings tried in order (1/s undoes a scaling by s)
SCALES = (1.0, 2.0, 1 / 0.9, 0.9, 1.5, 4 / 3, 1.25, 0.8, 0.75, 2 / 3, 0.5)
SYNC_Z = 7.0
#: candidate rescalings may not make the shorter side longer than this (deliveries are at most 1080p)
MAX_SEARCH_SIDE = 1088


def payload_for_job(job_id: str) -> list[int]:
    raw = hashlib.sha256(job_id.encode()).digest()[:PAYLOAD_BYTES]
    return [int(b) for b in np.unpackbits(np.frombuffer(raw, dtype=np.uint8))]


def bits_to_hex(bits: list[int] | np.ndarray) -> str:
    return np.packbits(np.asarray(bits, dtype=np.uint8)).tobytes().hex()


def payload_hex(job_id: str) -> str:
    return bits_to_hex(payload_for_job(job_id))


@dataclass(frozen=True)
class WatermarkKey:
    """A platform watermark secret (32 bytes) and its public id."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) != 32:
            raise ValidationFailed("a watermark key is 32 bytes")

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"gpufleet-watermark-key-id" + self.secret).hexdigest()[:16]


@dataclass(frozen=True)
class _Pattern:
    chips: np.ndarray  # (C, C) float32 ±1
    role: np.ndarray  # (C, C) int16: -1 sync, else the coded bit index


@functools.lru_cache(maxsize=8)
def _pattern(secret: bytes) -> _Pattern:
    seed = hmac.new(secret, f"{METHOD}/pattern".encode(), hashlib.sha256).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
    n = CANVAS_CELLS * CANVAS_CELLS
    chips = rng.integers(0, 2, size=n).astype(np.float32) * 2 - 1
    order = rng.permutation(n)
    role = np.empty(n, dtype=np.int16)
    n_sync = int(n * SYNC_SHARE)
    role[order[:n_sync]] = -1
    role[order[n_sync:]] = np.arange(n - n_sync) % CODED_BITS
    return _Pattern(chips.reshape(CANVAS_CELLS, CANVAS_CELLS), role.reshape(CANVAS_CELLS, CANVAS_CELLS))


def _cells_to_pixels(cells: np.ndarray, y0: int, x0: int, h: int, w: int) -> np.ndarray:
    """The canvas cell field at pixel rows y0..y0+h, columns x0..x0+w (wrapping), nearest cell."""
    ys = ((np.arange(y0, y0 + h) // CELL) % CANVAS_CELLS)
    xs = ((np.arange(x0, x0 + w) // CELL) % CANVAS_CELLS)
    return cells[np.ix_(ys, xs)]


def _smooth(a: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur (radius 3.5 σ, mirrored edges), float32, numpy only."""
    r = int(np.ceil(3.5 * sigma))
    k = np.exp(-(np.arange(-r, r + 1, dtype=np.float32) ** 2) / np.float32(2 * sigma * sigma))
    k /= k.sum()
    h, w = a.shape
    p = np.pad(a.astype(np.float32, copy=False), ((r, r), (0, 0)), mode="symmetric")
    rows = k[0] * p[0:h]
    for i in range(1, 2 * r + 1):
        rows += k[i] * p[i : i + h]
    p = np.pad(rows, ((0, 0), (r, r)), mode="symmetric")
    out = k[0] * p[:, 0:w]
    for i in range(1, 2 * r + 1):
        out += k[i] * p[:, i : i + w]
    return out


def _resize(a: np.ndarray, factor: float) -> np.ndarray:
    """Bilinear rescale by ``factor`` (blurred first when shrinking), numpy only."""
    if factor < 1.0:
        a = _smooth(a, 0.5 / factor)
    h, w = a.shape
    nh, nw = max(1, round(h * factor)), max(1, round(w * factor))
    ys = np.clip((np.arange(nh, dtype=np.float32) + 0.5) * (h / nh) - 0.5, 0, h - 1)
    xs = np.clip((np.arange(nw, dtype=np.float32) + 0.5) * (w / nw) - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = a[y0][:, x0] * (1 - fx) + a[y0][:, x1] * fx
    bottom = a[y1][:, x0] * (1 - fx) + a[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


def _fast_len(n: int) -> int:
    """The smallest 2^a·3^b·5^c ≥ n (a fast FFT size)."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _encode_bits(bits: list[int]) -> np.ndarray:
    from reedsolo import RSCodec

    if len(bits) != PAYLOAD_BITS or any(b not in (0, 1) for b in bits):
        raise ValidationFailed(f"a watermark payload is {PAYLOAD_BITS} bits of 0/1")
    data = np.packbits(np.asarray(bits, dtype=np.uint8)).tobytes()
    coded = bytes(RSCodec(PARITY_BYTES).encode(data))
    return np.unpackbits(np.frombuffer(coded, dtype=np.uint8)).astype(np.float32)


def _check(frames: np.ndarray) -> None:
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValidationFailed("frames must be uint8 RGB with shape (n, height, width, 3)")


def _luma(frame: np.ndarray) -> np.ndarray:
    f = frame.astype(np.float32)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def _activity(y: np.ndarray) -> np.ndarray:
    """Local contrast: the Gaussian-weighted standard deviation of the high-passed luma."""
    hp = y - _smooth(y, 2.0)
    return np.sqrt(_smooth(hp * hp, 4.0))


def embed(frames: np.ndarray, bits: list[int], key: WatermarkKey) -> np.ndarray:
    """Mark uint8 RGB frames (n, h, w, 3) with ``bits`` (48) under ``key``."""
    _check(frames)
    if min(frames.shape[1:3]) < MIN_SIDE:
        raise ValidationFailed(f"the watermark needs frames of at least {MIN_SIDE}x{MIN_SIDE}")
    p = _pattern(key.secret)
    coded = _encode_bits(bits) * 2 - 1  # ±1
    signs = np.where(p.role < 0, 1.0, coded[np.maximum(p.role, 0)]).astype(np.float32)
    h, w = frames.shape[1:3]
    field_ = _smooth(_cells_to_pixels(p.chips * signs, 0, 0, h, w), SMOOTH_SIGMA)
    field_ /= float(np.sqrt(np.mean(field_ * field_)))
    out = np.empty_like(frames)
    for i, frame in enumerate(frames):
        act = _activity(_luma(frame))
        amp = STRENGTH * np.clip(act / 3.0, 1.0, 2.5)
        delta = (amp * field_)[..., None]
        out[i] = np.clip(np.rint(frame.astype(np.float32) + delta), 0, 255).astype(np.uint8)
    return out


@dataclass(frozen=True)
class Detection:
    """What :func:`detect` found: ``valid`` only with a sync peak and a Reed–Solomon decode."""

    valid: bool
    bits: list[int]  # the 48 payload bits (decoded when valid, else the raw hard decisions)
    key_id: str | None = None
    sync_z: float = 0.0
    scale: float = 1.0
    flipped: bool = False
    offset: tuple[int, int] = (0, 0)
    raw_bit_errors: int | None = None  # coded-bit errors Reed–Solomon corrected (when valid)

    @property
    def confidence(self) -> float:
        """Share of the 128 coded bits read right (0 when not valid)."""
        return 1.0 - self.raw_bit_errors / CODED_BITS if self.valid and self.raw_bit_errors is not None else 0.0

    @property
    def hex(self) -> str:
        return bits_to_hex(self.bits)

    def matches(self, expected: list[int]) -> int:
        return int(sum(int(a == b) for a, b in zip(self.bits, expected, strict=True)))


def _prepare(frames: np.ndarray) -> np.ndarray:
    """Mean luma over frames, rescaled so the shorter side is at least :data:`MIN_SIDE`."""
    return _upscale_small(np.mean([_luma(f) for f in frames], axis=0).astype(np.float32))


def _upscale_small(y: np.ndarray) -> np.ndarray:
    side = min(y.shape)
    return _resize(y, MIN_SIDE / side) if side < MIN_SIDE else y


def _whiten(y: np.ndarray) -> np.ndarray:
    hp = y - _smooth(y, 2.5)
    return hp / (_activity(y) + 2.0)


def _sync_spectrum(p: _Pattern, h: int, w: int, margin: int) -> tuple[np.ndarray, int, int]:
    """The DFT of the sync pattern over canvas pixels -margin.. (padded to a fast DFT size)."""
    th, tw = _fast_len(h + 2 * margin), _fast_len(w + 2 * margin)
    sync = _smooth(_cells_to_pixels(np.where(p.role < 0, p.chips, 0).astype(np.float32), -margin, -margin, th, tw),
                   SMOOTH_SIGMA)
    return np.fft.rfft2(sync), th, tw


def _sync_search(r: np.ndarray, spectrum: tuple[np.ndarray, int, int], margin: int) -> tuple[float, int, int]:
    """Best (z, dy, dx): frame pixel (0, 0) sits at canvas pixel (dy, dx), |dy|, |dx| ≤ margin."""
    ft, th, tw = spectrum
    full = np.fft.irfft2(ft * np.conj(np.fft.rfft2(r, s=(th, tw))), s=(th, tw))
    corr = full[: 2 * margin + 1, : 2 * margin + 1]
    med = float(np.median(corr))
    mad = float(np.median(np.abs(corr - med))) * 1.4826 + 1e-9
    iy, ix = np.unravel_index(int(np.argmax(corr)), corr.shape)
    return (float(corr[iy, ix]) - med) / mad, int(iy) - margin, int(ix) - margin


def _soft_bits(r: np.ndarray, p: _Pattern, dy: int, dx: int) -> np.ndarray:
    h, w = r.shape
    chips = _smooth(_cells_to_pixels(p.chips, dy, dx, h, w), SMOOTH_SIGMA)
    role = _cells_to_pixels(p.role, dy, dx, h, w)
    data = role >= 0
    return np.bincount(role[data].ravel(), weights=(r * chips)[data].ravel(), minlength=CODED_BITS)


def _rs_decode(soft: np.ndarray) -> tuple[list[int], int] | None:
    from reedsolo import ReedSolomonError, RSCodec

    hard = (soft > 0).astype(np.uint8)
    word = bytearray(np.packbits(hard).tobytes())
    rs = RSCodec(PARITY_BYTES)
    reliability = np.abs(soft).reshape(-1, 8).min(axis=1)
    # At most 4 erasures: 6 parity symbols stay to check the decode (a random word decodes with
    # probability ~1e-5 then; ~4e-9 with none), besides the keyed sync peak.
    for n_erase in (0, 2, 4):
        erase = sorted(np.argsort(reliability)[:n_erase].tolist()) if n_erase else None
        try:
            data, full, _ = rs.decode(word, erase_pos=erase)
        except ReedSolomonError:
            continue
        fixed = np.unpackbits(np.frombuffer(bytes(full), dtype=np.uint8))
        return [int(b) for b in np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))], int((fixed != hard).sum())
    return None


def _search(y: np.ndarray, p: _Pattern) -> tuple[float, float, bool, int, int, np.ndarray]:
    best: tuple[float, float, bool, int, int, np.ndarray] | None = None
    for s in SCALES:
        if s != 1.0 and min(y.shape) * s > MAX_SEARCH_SIDE:
            continue  # enlarging an already large frame undoes no scaling we deliver
        ys = y if s == 1.0 else _resize(y, s)
        if min(ys.shape) < MIN_SIDE // 2:
            continue
        r = _whiten(ys)
        margin = int(0.2 * max(r.shape)) + 16
        spectrum = _sync_spectrum(p, *r.shape, margin)
        for flipped in (False, True):
            rr = np.ascontiguousarray(r[:, ::-1]) if flipped else r
            z, dy, dx = _sync_search(rr, spectrum, margin)
            if best is None or z > best[0]:
                best = (z, s, flipped, dy, dx, rr)
        if best[0] >= SYNC_Z:
            break
    assert best is not None
    return best


def mean_luma(frames: np.ndarray) -> np.ndarray:
    """The frames' mean luma as uint8 (h, w): all :func:`detect_luma` needs (what a lookup uploads)."""
    _check(frames)
    if not len(frames):
        raise ValidationFailed("no frames")
    return np.clip(np.rint(np.mean([_luma(f) for f in frames], axis=0)), 0, 255).astype(np.uint8)


def detect(frames: np.ndarray, keys: list[WatermarkKey] | tuple[WatermarkKey, ...]) -> Detection:
    """Look for a mark under each of ``keys``; the first valid detection wins (else the strongest)."""
    _check(frames)
    if not len(frames) or min(frames.shape[1:3]) < 16:
        raise ValidationFailed("no frames large enough to look for a watermark")
    return _detect_plane(_prepare(frames), keys)


def detect_luma(luma: np.ndarray, keys: list[WatermarkKey] | tuple[WatermarkKey, ...]) -> Detection:
    """:func:`detect` on a mean-luma plane (h, w) such as :func:`mean_luma` returns."""
    if luma.ndim != 2 or min(luma.shape) < 16:
        raise ValidationFailed("a luma plane is 2-D, each side at least 16 px")
    return _detect_plane(_upscale_small(luma.astype(np.float32)), keys)


def _detect_plane(y: np.ndarray, keys: list[WatermarkKey] | tuple[WatermarkKey, ...]) -> Detection:
    fallback: Detection | None = None
    for key in keys:
        p = _pattern(key.secret)
        z, s, flipped, dy, dx, r = _search(y, p)
        soft = _soft_bits(r, p, dy, dx)
        decoded = _rs_decode(soft) if z >= SYNC_Z else None
        if decoded is not None:
            return Detection(True, decoded[0], key.key_id, z, s, flipped, (dy, dx), decoded[1])
        raw = [int(b) for b in (soft[:PAYLOAD_BITS] > 0)]
        cand = Detection(False, raw, key.key_id, z, s, flipped, (dy, dx), None)
        if fallback is None or cand.sync_z > fallback.sync_z:
            fallback = cand
    if fallback is None:
        raise ValidationFailed("no watermark key to detect with")
    return fallback
