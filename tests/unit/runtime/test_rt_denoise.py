"""The resumable loop: restoring a snapshot taken after any step reproduces the uninterrupted output bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpufleet.runtime import denoise

pytestmark = pytest.mark.xdist_group("runtime-torch")  # share one worker's torch import

STEPS = 4


@pytest.fixture
def pipe(tiny_pipe):
    return tiny_pipe


def _request(**kw):
    base = dict(prompt="a blue bird flying over the sea", negative_prompt="blur", frames=5, width=16, height=16,
                steps=STEPS, seed=3, guidance=5.0, max_sequence_length=16)
    return denoise.GenerationRequest(**{**base, **kw})


def _full(pipe, req):
    state = denoise.start(pipe, req, "fp")
    while state.next_step < req.steps:
        denoise.denoise_step(pipe, req, state)
    return denoise.decode(pipe, state.latents)


def test_loop_matches_the_stock_pipeline_and_resumes_bitwise_after_every_step(pipe):
    # One test (not two): both need the built pipeline, and workers would each build it.
    req = _request()
    expected = _full(pipe, req)
    stock = pipe(req.prompt, negative_prompt=req.negative_prompt, height=16, width=16, num_frames=5,
                 num_inference_steps=STEPS, guidance_scale=5.0, generator=torch.Generator().manual_seed(3),
                 max_sequence_length=16, output_type="np").frames[0]
    assert np.array_equal(expected, stock)
    for k in range(STEPS + 1):
        state = denoise.start(pipe, req, "fp")
        for _ in range(k):
            denoise.denoise_step(pipe, req, state)
        blob = denoise.serialize(denoise.snapshot(pipe, state))
        # Disturb everything the snapshot must restore: scheduler, global RNG.
        pipe.scheduler.set_timesteps(17)
        torch.manual_seed(12345)
        resumed = denoise.restore(pipe, denoise.deserialize(blob))
        assert resumed.next_step == k
        while resumed.next_step < req.steps:
            denoise.denoise_step(pipe, req, resumed)
        assert np.array_equal(denoise.decode(pipe, resumed.latents), expected), f"resume after step {k}"


def test_corrupt_or_foreign_bytes_are_not_a_snapshot():
    with pytest.raises(ValueError):
        denoise.deserialize(b"not a checkpoint")
    with pytest.raises(ValueError):
        denoise.deserialize(denoise.serialize({"version": 999}))
