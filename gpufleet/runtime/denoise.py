"""A resumable denoising loop for diffusers ``WanPipeline`` (pure torch; no I/O).

The stock pipeline cannot start mid-schedule, so every run (fresh or resumed)
goes through the same loop: encode the prompts, prepare latents, then one
:func:`denoise_step` per scheduler timestep (transformer + classifier-free
guidance + ``scheduler.step``), then :func:`decode` with the pipeline's VAE.

Resume is bitwise identical on the same machine because a :func:`snapshot`
holds everything the loop reads: latents, the next step index, the
scheduler's mutable state (``__dict__`` minus ``_internal_dict``), the
generator state, the torch global RNG state and the prompt embeddings. A
snapshot is a dict of CPU tensors and plain values; :func:`serialize` writes it in the
pickle-free layout of :mod:`gpufleet.runtime.snapcodec` (``torch.save`` as a fallback), and
:func:`deserialize` reads both (``torch.load`` with ``weights_only=True`` for the latter).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from gpufleet.runtime import snapcodec

SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    negative_prompt: str
    frames: int
    width: int  # generation size (may be below the delivered size; finalize upscales)
    height: int
    steps: int
    seed: int
    guidance: float
    max_sequence_length: int = 64

    def fingerprint(self, model_hash: str) -> str:
        body = json.dumps({"req": asdict(self), "model": model_hash, "v": SNAPSHOT_VERSION}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()


@dataclass
class DenoiseState:
    latents: torch.Tensor
    next_step: int
    prompt_embeds: torch.Tensor
    negative_prompt_embeds: torch.Tensor | None
    generator: torch.Generator
    fingerprint: str


def _cfg(req: GenerationRequest) -> bool:
    return req.guidance > 1.0


def start(pipe, req: GenerationRequest, fingerprint: str) -> DenoiseState:
    """Fresh state at step 0 (seeds the global RNG and the generator from ``req.seed``)."""
    torch.manual_seed(req.seed)
    generator = torch.Generator(device="cpu").manual_seed(req.seed)
    with torch.no_grad():
        prompt_embeds, negative_embeds = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt or "",
            do_classifier_free_guidance=_cfg(req),
            num_videos_per_prompt=1,
            max_sequence_length=req.max_sequence_length,
            device=torch.device("cpu"),
        )
    dtype = pipe.transformer.dtype
    prompt_embeds = prompt_embeds.to(dtype)
    if negative_embeds is not None:
        negative_embeds = negative_embeds.to(dtype)
    pipe.scheduler.set_timesteps(req.steps, device="cpu")
    latents = pipe.prepare_latents(
        1, pipe.transformer.config.in_channels, req.height, req.width, req.frames,
        torch.float32, torch.device("cpu"), generator, None,
    )
    pipe.scheduler.set_begin_index(0)
    return DenoiseState(latents, 0, prompt_embeds, negative_embeds, generator, fingerprint)


def denoise_step(pipe, req: GenerationRequest, state: DenoiseState) -> None:
    """Run step ``state.next_step`` in place and advance it by one."""
    i = state.next_step
    t = pipe.scheduler.timesteps[i]
    model = pipe.transformer
    with torch.no_grad():
        latent_in = state.latents.to(model.dtype)
        timestep = t.expand(state.latents.shape[0])
        noise = model(hidden_states=latent_in, timestep=timestep,
                      encoder_hidden_states=state.prompt_embeds, return_dict=False)[0]
        if _cfg(req):
            uncond = model(hidden_states=latent_in, timestep=timestep,
                           encoder_hidden_states=state.negative_prompt_embeds, return_dict=False)[0]
            noise = uncond + req.guidance * (noise - uncond)
        state.latents = pipe.scheduler.step(noise, t, state.latents, generator=state.generator,
                                            return_dict=False)[0]
    state.next_step = i + 1


def decode(pipe, latents: torch.Tensor) -> np.ndarray:
    """Latents → frames, float32 in [0, 1], shape (frames, height, width, 3)."""
    vae = pipe.vae
    with torch.no_grad():
        lat = latents.to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(lat)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(lat)
        video = vae.decode(lat / inv_std + mean, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(video, output_type="np")
    return np.ascontiguousarray(frames[0], dtype=np.float32)


def _scheduler_state(scheduler) -> dict[str, Any]:
    out = {}
    for k, v in scheduler.__dict__.items():
        if k == "_internal_dict":
            continue
        out[k] = v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return out


def snapshot(pipe, state: DenoiseState) -> dict[str, Any]:
    """A self-contained copy of the loop state (safe to serialise on another thread)."""
    return {
        "version": SNAPSHOT_VERSION,
        "fingerprint": state.fingerprint,
        "next_step": state.next_step,
        "latents": state.latents.detach().clone(),
        "prompt_embeds": state.prompt_embeds.detach().clone(),
        "negative_prompt_embeds": None
        if state.negative_prompt_embeds is None
        else state.negative_prompt_embeds.detach().clone(),
        "scheduler": _scheduler_state(pipe.scheduler),
        "generator_state": state.generator.get_state().clone(),
        "torch_rng_state": torch.get_rng_state().clone(),
    }


def restore(pipe, snap: dict[str, Any]) -> DenoiseState:
    """Rebuild the loop state from a :func:`snapshot` (mutates the pipeline's scheduler and the global RNG)."""
    pipe.scheduler.__dict__.update(snap["scheduler"])
    generator = torch.Generator(device="cpu")
    generator.set_state(snap["generator_state"])
    torch.set_rng_state(snap["torch_rng_state"])
    return DenoiseState(snap["latents"], int(snap["next_step"]), snap["prompt_embeds"],
                        snap["negative_prompt_embeds"], generator, snap["fingerprint"])


def serialize(snap: dict[str, Any]) -> bytes:
    """Snapshot → bytes: the fast safetensors layout of :mod:`snapcodec` (tens of µs, fit for the
    compute thread), or ``torch.save`` when the scheduler state holds a value that layout cannot
    represent exactly."""
    try:
        return snapcodec.encode(snap)
    except snapcodec.Unsupported:
        buf = io.BytesIO()
        torch.save(snap, buf)
        return buf.getvalue()


def deserialize(data: bytes) -> dict[str, Any]:
    """Inverse of :func:`serialize`; raises ``ValueError`` on anything that is not a valid snapshot."""
    if snapcodec.is_encoded(data):
        snap = snapcodec.decode(data)
    else:
        try:
            snap = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as err:  # torch raises many types for corrupt archives
            raise ValueError(f"not a loadable checkpoint: {err}") from err
    if not isinstance(snap, dict) or snap.get("version") != SNAPSHOT_VERSION:
        raise ValueError("checkpoint has an unknown layout")
    return snap
