"""A denoising batch of jobs on threads gives each member bitwise the frames it gets alone, also when members
start at different steps or leave early, and splits the rounds' time among the members of each round."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from gpufleet.runtime import denoise
from gpufleet.runtime.batchloop import DenoiseBatch

pytestmark = pytest.mark.xdist_group("runtime-torch")  # share one worker's torch import

STEPS = 5


@pytest.fixture
def pipe(tiny_pipe):
    return tiny_pipe


def _request(seed: int, prompt: str) -> denoise.GenerationRequest:
    return denoise.GenerationRequest(
        prompt=prompt,
        negative_prompt="blur",
        frames=5,
        width=32,
        height=32,
        steps=STEPS,
        seed=seed,
        guidance=5.0,
        max_sequence_length=16,
    )


REQUESTS = [
    _request(3, "a red fox running in snow"),
    _request(4, "a blue bird over the sea"),
    _request(5, "a cat"),
    _request(6, "a boat on a river at night"),
]


def _alone(pipe, req, until: int = STEPS) -> torch.Tensor:
    state = denoise.start(pipe, req, "fp")
    while state.next_step < until:
        denoise.denoise_step(pipe, req, state)
    return state.latents


def _member(batch, pipe, req, out, k, *, leave_after=None, resume_from=None):
    m = batch.member()
    try:
        if resume_from is None:
            state = m.start(pipe, req, "fp")
        else:
            state = m.restore(pipe, req, denoise.deserialize(resume_from))
        while state.next_step < req.steps and (leave_after is None or state.next_step < leave_after):
            m.step(pipe, req, state)
        out[k] = (state.latents, m)
    finally:
        m.leave()


def _run(pipe, plans, **batch_kw):
    batch = DenoiseBatch(
        len(plans), max_members=batch_kw.pop("max_members", 4), free_bytes=lambda: None, gather_s=2.0, **batch_kw
    )
    out: dict = {}
    threads = [
        threading.Thread(target=_member, args=(batch, pipe, req, out, k), kwargs=kw)
        for k, (req, kw) in enumerate(plans)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return batch, out


def test_members_get_bitwise_their_solo_latents_and_one_leaving_early_disturbs_no_one(pipe):
    solo = [_alone(pipe, r) for r in REQUESTS[:3]]
    # member 1 leaves after two steps (a cancel); member 2 resumes from a checkpoint of step 2
    snap_state = denoise.start(pipe, REQUESTS[2], "fp")
    for _ in range(2):
        denoise.denoise_step(pipe, REQUESTS[2], snap_state)
    blob = denoise.serialize(denoise.snapshot(pipe, snap_state))
    batch, out = _run(
        pipe, [(REQUESTS[0], {}), (REQUESTS[1], {"leave_after": 2}), (REQUESTS[2], {"resume_from": blob})]
    )
    assert torch.equal(out[0][0], solo[0])
    assert torch.equal(out[1][0], _alone(pipe, REQUESTS[1], until=2))
    assert torch.equal(out[2][0], solo[2])
    assert out[0][1].steps() == STEPS and out[1][1].steps() == 2 and out[2][1].steps() == STEPS - 2
    assert out[0][1].widest() == 3
    assert batch.rounds == STEPS
    # shares add up to the rounds' time; the member in every round pays the most
    shares = [out[k][1].share_s() for k in range(3)]
    assert sum(shares) == pytest.approx(batch.ledger.total_s)
    assert shares[0] >= max(shares[1], shares[2])
    # a batch-member snapshot resumes alone to the same result
    m_state = denoise.own_scheduler(pipe, denoise.start(pipe, REQUESTS[0], "fp"))
    denoise.denoise_batch_step(
        pipe,
        [(REQUESTS[0], m_state), (REQUESTS[1], denoise.own_scheduler(pipe, denoise.start(pipe, REQUESTS[1], "fp")))],
    )
    resumed = denoise.restore(pipe, denoise.deserialize(denoise.serialize(denoise.snapshot(pipe, m_state))))
    while resumed.next_step < STEPS:
        denoise.denoise_step(pipe, REQUESTS[0], resumed)
    assert torch.equal(resumed.latents, solo[0])
    frames = denoise.decode(pipe, out[0][0])
    assert np.array_equal(frames, denoise.decode(pipe, solo[0]))


def test_padded_calls_give_the_same_latents_alone_and_in_a_batch(pipe, monkeypatch):
    """The GPU path (every transformer call padded to one shape, single jobs through the batch call with both guidance
    branches) exercised on the CPU, where rows are batch-invariant either way: padding changes no one's result, alone
    or in a batch, and the padding's rows never reach a member (the H200 measurement of the GPU property itself is
    in docs/benchmarks.md, "Runtime: batching")."""
    solo = [_alone(pipe, r) for r in REQUESTS[:2]]
    monkeypatch.setattr(denoise, "PAD_DEVICES", ("cuda", "cpu"))
    denoise.set_pad_rows(8)
    try:
        assert all(torch.equal(_alone(pipe, r), s) for r, s in zip(REQUESTS[:2], solo, strict=True))
        _, out = _run(pipe, [(REQUESTS[0], {}), (REQUESTS[1], {})])
        assert torch.equal(out[0][0], solo[0]) and torch.equal(out[1][0], solo[1])
    finally:
        denoise.set_pad_rows(0)
    with pytest.raises(ValueError):
        denoise.set_pad_rows(-1)


def test_capacity_admits_the_rest_as_members_leave(pipe):
    solo = [_alone(pipe, r) for r in REQUESTS]
    batch, out = _run(pipe, [(r, {}) for r in REQUESTS], max_members=2)
    assert batch.capacity == 2
    for k in range(4):
        assert torch.equal(out[k][0], solo[k])
        assert out[k][1].widest() <= 2
