"""What each video model can generate: per-model limits checked at submission (no torch import).

Contract:
- Wan's transformer gives every latent position a rotary embedding from a table of
  ``rope_max_seq_len`` rows per axis (diffusers ``WanRotaryPosEmbed``): a video whose
  latent grid is longer than the table on any axis crashes the model's shape logic,
  on every attempt. The latent grid of ``frames`` × ``height`` × ``width`` pixels is
  ``(frames - 1) / 4 + 1`` latent frames (the VAE compresses 4 frames, so frames are
  4k+1) by ``height / 16`` × ``width / 16`` patches (VAE ×8, patch 2; so sides are
  multiples of 16).
- :func:`limits_for` returns a model's :class:`ModelLimits`: the largest frames,
  side and steps it can do, capped by the API's own limits. ``wan-tiny`` (the test
  and demo model) has a 32-row table: at most 125 frames; it generates at most
  :data:`TINY_SIDE_MAX` px a side (the runtime scales larger requests down and
  finalize scales them up, so every API size is accepted). Any other model name
  is a full-size Wan model (1024 rows: the API limits bind first).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Wan's VAE compresses this many frames into one latent frame (frames are 4k+1).
TEMPORAL_COMPRESSION = 4
#: pixels per transformer patch on each side (VAE ×8, patch 2): width and height are multiples of it.
SPATIAL_MULTIPLE = 16
#: rope_max_seq_len of the tiny model (gpufleet.models.tiny_wan builds it with this value)
TINY_ROPE_MAX_SEQ_LEN = 32
#: rope_max_seq_len of the published Wan 2.x transformers (diffusers' default)
WAN_ROPE_MAX_SEQ_LEN = 1024
#: the largest side wan-tiny can generate (the runtime setting tiny_generate_side may not exceed it)
TINY_SIDE_MAX = SPATIAL_MULTIPLE * TINY_ROPE_MAX_SEQ_LEN
TINY_MODEL = "wan-tiny"


@dataclass(frozen=True)
class ModelLimits:
    frames_max: int
    side_max: int
    steps_max: int


def frames_for_rope(rope_max_seq_len: int) -> int:
    """The most frames (4k+1) whose latent frames fit a rotary table of ``rope_max_seq_len`` rows."""
    return TEMPORAL_COMPRESSION * (rope_max_seq_len - 1) + 1


def limits_for(model: str, api_frames_max: int, api_side_max: int, api_steps_max: int) -> ModelLimits:
    """``model``'s limits, never above the API's (``api_*``)."""
    rope = TINY_ROPE_MAX_SEQ_LEN if model == TINY_MODEL else WAN_ROPE_MAX_SEQ_LEN
    # wan-tiny scales any requested size down to at most TINY_SIDE_MAX, so only frames bind
    side = api_side_max if model == TINY_MODEL else min(api_side_max, SPATIAL_MULTIPLE * rope)
    return ModelLimits(frames_max=min(api_frames_max, frames_for_rope(rope)), side_max=side,
                       steps_max=api_steps_max)
