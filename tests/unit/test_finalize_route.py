"""Where a clip finalizes (gpufleet.finalize_route): frames × delivered pixels against FinalizeLambda's bound."""

from __future__ import annotations

import pytest

from gpufleet import finalize_route as route
from gpufleet.provenance import video, watermark


def test_the_delivered_size_is_the_watermarks_and_the_videos():
    assert route.MIN_SIDE == watermark.MIN_SIDE == 256
    assert video.delivery_size is route.delivery_size
    assert route.delivery_size(64, 64) == (256, 256)
    assert route.delivery_size(512, 256) == (512, 256)  # already at the minimum: unchanged
    assert route.delivery_size(320, 192) == (428, 256)  # scaled up, the aspect kept, even sides


@pytest.mark.parametrize(("frames", "w", "h", "lambda_"), [
    (9, 256, 256, True),       # the demo clip: 589,824 pixels
    (121, 512, 512, True),     # 31.7 Mi: under the bound
    (129, 512, 512, False),    # 33.8 Mi: over it, Batch
    (257, 1920, 1920, False),  # the largest spec
])
def test_the_bound_sends_short_clips_to_the_lambda(frames, w, h, lambda_):
    pixels = route.finalize_pixels(frames, w, h)
    assert pixels == frames * route.delivery_size(w, h)[0] * route.delivery_size(w, h)[1]
    assert route.runs_in_lambda(pixels) is lambda_
    assert route.runs_in_lambda(pixels, bound=0) is False  # a bound of 0: every clip to Batch


def test_the_bound_fits_the_functions_limits_with_the_measured_margin():
    # docs/benchmarks.md "Finalize: the Lambda bound": at most 26.1 bytes of peak memory per pixel over a ≈ 200 MB
    # base, at most 2.3 s per million pixels on a loaded 2-core machine; the bound keeps both under half the limits
    assert 200 + route.LAMBDA_MAX_PIXELS * 26.1 / 2**20 < route.LAMBDA_MEMORY_MB / 2
    assert route.LAMBDA_MAX_PIXELS / 1e6 * 2.3 < route.LAMBDA_TIMEOUT_S / 2
