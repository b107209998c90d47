"""Where a video's finalize stage runs: the warm finalize Lambda for short clips, the CPU Batch job for large ones.

Contract (docs/lifecycle.md "Finalize"):
- :func:`delivery_size` is the size finalize delivers: the spec's size scaled up so the shorter side is at least
  :data:`MIN_SIDE` (the watermark's minimum, :data:`gpufleet.provenance.watermark.MIN_SIDE`), even dimensions.
- :func:`finalize_pixels` is the work finalize does on a clip, as frames × delivered pixels per frame: moderation,
  watermarking and H.264 encoding each grow linearly with it, and so does the memory (the delivered frames and their
  watermarked copy). CompleteRun puts it on its result (``finalize_pixels``) and the workflow's ``FinalizeRoute``
  sends a clip of at most ``finalize_lambda_max_pixels`` (:data:`LAMBDA_MAX_PIXELS` by default) to ``FinalizeLambda``,
  a larger one to ``FinalizeStage`` (the CPU Batch job). Pure: no AWS, no numpy.
- :data:`LAMBDA_MAX_PIXELS` is measured against the Lambda's limits (docs/benchmarks.md "Finalize: the Lambda
  bound"): at the finalize function's memory (:data:`LAMBDA_MEMORY_MB`) a clip of the bound keeps its peak resident
  memory under half the function's memory and its time far under the function's timeout (15 min, the Lambda
  maximum), so a slower machine or a retry still fits.
"""

from __future__ import annotations

#: the watermark's minimum delivered side (gpufleet.provenance.watermark.MIN_SIDE re-exports it)
MIN_SIDE = 256
#: the finalize Lambda's memory (MB) and timeout (s): infra/config.py FINALIZE_FUNCTION
LAMBDA_MEMORY_MB = 3008
LAMBDA_TIMEOUT_S = 900
#: the largest clip (frames × delivered pixels) the finalize Lambda takes; larger ones go to the Batch job
LAMBDA_MAX_PIXELS = 32 * 1024 * 1024


def delivery_size(width: int, height: int, min_side: int = MIN_SIDE) -> tuple[int, int]:
    """Scale (width, height) up so the shorter side is at least ``min_side``, keeping even dimensions."""
    scale = max(1.0, min_side / min(width, height))
    w, h = int(round(width * scale)), int(round(height * scale))
    return w + (w % 2), h + (h % 2)


def finalize_pixels(frames: int, width: int, height: int) -> int:
    """Frames × delivered pixels of a clip of ``frames`` frames generated at ``width`` × ``height``."""
    w, h = delivery_size(width, height)
    return int(frames) * w * h


def runs_in_lambda(pixels: int, bound: int = LAMBDA_MAX_PIXELS) -> bool:
    """Whether ``FinalizeRoute`` sends a clip of ``pixels`` to the finalize Lambda (the workflow's Choice, as Python)."""
    return pixels <= bound
