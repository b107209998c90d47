"""Every frames / width / height / steps value the API accepts for wan-tiny generates on the real tiny
model (a diffusers run: the documented limits swept at their extremes, 1 step unless steps is the point),
and the first value past a model limit is refused at submission."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gpufleet.models.limits import TINY_MODEL, TINY_SIDE_MAX, limits_for
from gpufleet.models.tiny_wan import build_tiny_wan
from gpufleet.runtime import denoise
from gpufleet.runtime.generate import generation_request
from gpufleet.runtime.settings import RuntimeSettings
from gpufleet.spec import LIMITS, JobSpec

pytestmark = pytest.mark.xdist_group("runtime-torch")  # share one worker's torch import

TINY = limits_for(TINY_MODEL, int(LIMITS["frames_max"]), int(LIMITS["width_max"]), int(LIMITS["steps_max"]))
LO = int(LIMITS["width_min"])
DEFAULT_SIDE = RuntimeSettings.model_fields["tiny_generate_side"].default

# (frames, width, height, steps, tiny_generate_side): each limit at its extremes
SWEEP = [
    (int(LIMITS["frames_min"]), LO, LO, 1, DEFAULT_SIDE),
    (TINY.frames_max, LO, LO, 1, DEFAULT_SIDE),
    (TINY.frames_max, TINY.side_max, LO, 1, DEFAULT_SIDE),
    (TINY.frames_max, LO, TINY.side_max, 1, DEFAULT_SIDE),
    (TINY.frames_max, TINY.side_max, TINY.side_max, 1, DEFAULT_SIDE),
    (5, LO, LO, TINY.steps_max, DEFAULT_SIDE),
    (1, TINY.side_max, TINY.side_max, 1, TINY_SIDE_MAX),  # the largest side the runtime setting allows
]


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    return build_tiny_wan()


@pytest.mark.parametrize(("frames", "width", "height", "steps", "side"), SWEEP)
def test_accepted_extremes_generate_on_the_tiny_model(pipe, frames, width, height, steps, side):
    spec = JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "a red fox", "frames": frames,
                                                "width": width, "height": height, "steps": steps, "guidance": 1.0}})
    req = generation_request(spec.workload, side)
    state = denoise.start(pipe, req, "fp")
    while state.next_step < req.steps:
        denoise.denoise_step(pipe, req, state)
    out = denoise.decode(pipe, state.latents)
    assert out.shape == (frames, req.height, req.width, 3)


def test_one_past_each_limit_is_refused_at_submission():
    for field, value in (("frames", TINY.frames_max + 4), ("width", TINY.side_max + 16),
                         ("height", TINY.side_max + 16), ("steps", TINY.steps_max + 1)):
        with pytest.raises(ValidationError) as info:
            JobSpec.model_validate({"workload": {"kind": "video.generate", "prompt": "x", field: value}})
        assert info.value.errors()[0]["loc"][-1] == field
    with pytest.raises(ValidationError):
        RuntimeSettings(tiny_generate_side=TINY_SIDE_MAX + 16)
