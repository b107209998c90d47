"""The keyed watermark: the robustness table, forgery and erasure without the key, key files.

Clips are procedural (:mod:`gpufleet.provenance.robustness`): a 512×512 natural-statistics clip
and a 256×256 smooth "generated" one, each marked once per module.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.errors import ConfigError, ValidationFailed
from gpufleet.provenance import keys, robustness, watermark
from gpufleet.provenance.watermark import WatermarkKey

KEY = WatermarkKey(bytes(range(32)))
ATTACKER = WatermarkKey(b"\xa5" * 32)
BITS = watermark.payload_for_job("job_01watermarktable")
EVIL = watermark.payload_for_job("job_01somebodyelse")


@pytest.fixture(scope="module")
def clips():
    natural = robustness.natural_clip(8, 512)
    generated = robustness.generated_clip(8, 256)
    return {
        "natural512": (natural, watermark.embed(natural, BITS, KEY)),
        "generated256": (generated, watermark.embed(generated, BITS, KEY)),
    }


@pytest.mark.parametrize("clip", ["natural512", "generated256"])
@pytest.mark.parametrize("transform", list(robustness.TRANSFORMS))
def test_the_payload_survives(clips, clip, transform):
    _, marked = clips[clip]
    found = watermark.detect(robustness.TRANSFORMS[transform](marked), [KEY])
    assert found.valid, found
    assert found.matches(BITS) >= 44 and found.key_id == KEY.key_id


@pytest.mark.parametrize("clip", ["natural512", "generated256"])
def test_the_mark_is_near_invisible(clips, clip):
    original, marked = clips[clip]
    mse = np.mean((original.astype(np.float64) - marked) ** 2)
    assert 10 * np.log10(255**2 / mse) > 34.5  # PSNR in dB
    assert np.abs(original.astype(int) - marked).max() <= 12


def test_unmarked_video_has_no_valid_mark(clips):
    for original, _ in clips.values():
        assert not watermark.detect(original, [KEY]).valid


def _public_library_stamp(frames: np.ndarray, bits: list[int]) -> np.ndarray:
    from imwatermark import WatermarkEncoder

    enc = WatermarkEncoder()
    enc.set_watermark("bits", list(bits))
    return np.stack([enc.encode(np.ascontiguousarray(f[:, :, ::-1]), "dwtDctSvd")[:, :, ::-1] for f in frames])


@pytest.mark.parametrize("clip", ["natural512", "generated256"])
def test_a_payload_stamped_without_the_key_is_not_a_valid_mark(clips, clip):
    original = clips[clip][0][:3]
    # The attacker knows the payload, the scheme and its parameters, but not the platform's key.
    for forged in (watermark.embed(original, EVIL, ATTACKER), _public_library_stamp(original, EVIL)):
        found = watermark.detect(forged, [KEY])
        assert not found.valid and found.sync_z < watermark.SYNC_Z


@pytest.mark.parametrize("clip", ["natural512", "generated256"])
def test_erasing_without_the_key_leaves_the_mark(clips, clip):
    import cv2

    _, marked = clips[clip]
    overwritten = watermark.embed(marked, EVIL, ATTACKER)  # re-mark with another payload, own key
    relabelled = _public_library_stamp(marked[:3], EVIL)  # the old public scheme's overwrite
    # Estimate the mark as the frames' mean high-pass residual and subtract it.
    f = marked.astype(np.float32)
    residual = f - np.stack([cv2.GaussianBlur(x, (0, 0), 2.5) for x in f])
    subtracted = np.clip(np.rint(f - residual.mean(axis=0)), 0, 255).astype(np.uint8)
    for attacked in (overwritten, relabelled, subtracted):
        found = watermark.detect(attacked, [KEY])
        assert found.valid and found.bits == BITS


def test_detection_tries_every_key_and_reports_which_found_it(clips):
    _, marked = clips["generated256"]
    found = watermark.detect(marked, [ATTACKER, KEY])
    assert found.valid and found.key_id == KEY.key_id and found.bits == BITS
    assert not watermark.detect(marked, [ATTACKER]).valid


def test_reed_solomon_corrects_flipped_coded_bits():
    soft = watermark._encode_bits(BITS) * 2 - 1
    soft[[0, 9, 20, 33, 77]] *= -1  # five bit errors in five bytes
    assert watermark._rs_decode(soft) == (BITS, 5)
    rng = np.random.default_rng(3)
    assert all(watermark._rs_decode(rng.normal(size=watermark.CODED_BITS)) is None for _ in range(50))


def test_embed_refuses_bad_input():
    with pytest.raises(ValidationFailed):
        watermark.embed(np.zeros((1, 128, 128, 3), np.uint8), BITS, KEY)
    with pytest.raises(ValidationFailed):
        watermark.embed(np.zeros((1, 256, 256, 3), np.uint8), BITS[:40], KEY)
    with pytest.raises(ValidationFailed):
        WatermarkKey(b"short")


def test_watermark_key_files(tmp_path):
    first = keys.dev_watermark_keys(tmp_path)
    assert keys.dev_watermark_keys(tmp_path) == first  # created once, then reused
    path = keys.watermark_keys_path(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("11" * 32 + "\n" + first[0].secret.hex() + "\n")
    rotated = keys.load_watermark_keys(path)
    assert [k.secret for k in rotated] == [b"\x11" * 32, first[0].secret]
    assert len({k.key_id for k in rotated}) == 2 and all(len(k.key_id) == 16 for k in rotated)
    path.write_text("not hex\n")
    with pytest.raises(ConfigError):
        keys.load_watermark_keys(path)
    with pytest.raises(ConfigError):
        keys.load_watermark_keys(tmp_path / "missing")
