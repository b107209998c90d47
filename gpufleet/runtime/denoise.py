"""A resumable denoising loop for diffusers ``WanPipeline`` (pure torch; no I/O).

The stock pipeline cannot start mid-schedule, so every run (fresh or resumed)
goes through the same loop: encode the prompts, prepare latents, then one
:func:`denoise_step` per scheduler timestep (transformer + classifier-free
guidance + ``scheduler.step``), then :func:`decode` with the pipeline's VAE.

Devices: the loop runs where the pipeline's transformer is (``load_pipeline(path,
device)``; the generate stage picks cuda when it is visible). The generator and the
scheduler stay on the CPU (the initial noise, and so the result for a seed, does not
depend on the device's RNG; diffusers' schedulers accept CPU scalars next to device
tensors), the latents and prompt embeddings live on the device, and a snapshot is always
CPU tensors: :func:`snapshot` copies device tensors to the host (that copy is the
compute thread's only checkpoint cost) and :func:`restore` moves them back.

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


def device_of(pipe) -> torch.device:
    """Where the loop runs: the transformer's device."""
    return pipe.transformer.device


def _to(value: Any, device: torch.device | str) -> Any:
    """``value`` with every tensor inside (lists, tuples, dicts) moved to ``device`` (no copy if already there)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if type(value) in (list, tuple):
        return type(value)(_to(v, device) for v in value)
    if type(value) is dict:
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _host_copy(value: Any) -> Any:
    """A copy of ``value`` with every tensor inside copied to the CPU; shares no storage with ``value``."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if type(value) in (list, tuple):
        return type(value)(_host_copy(v) for v in value)
    if type(value) is dict:
        return {k: _host_copy(v) for k, v in value.items()}
    return copy.deepcopy(value)


def start(pipe, req: GenerationRequest, fingerprint: str) -> DenoiseState:
    """Fresh state at step 0 (seeds the global RNG and the generator from ``req.seed``)."""
    torch.manual_seed(req.seed)
    generator = torch.Generator(device="cpu").manual_seed(req.seed)
    device = device_of(pipe)
    with torch.no_grad():
        prompt_embeds, negative_embeds = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt or "",
            do_classifier_free_guidance=_cfg(req),
            num_videos_per_prompt=1,
            max_sequence_length=req.max_sequence_length,
            device=device,
        )
    dtype = pipe.transformer.dtype
    prompt_embeds = prompt_embeds.to(dtype)
    if negative_embeds is not None:
        negative_embeds = negative_embeds.to(dtype)
    pipe.scheduler.set_timesteps(req.steps, device="cpu")
    latents = pipe.prepare_latents(
        1, pipe.transformer.config.in_channels, req.height, req.width, req.frames,
        torch.float32, torch.device("cpu"), generator, None,
    ).to(device)  # drawn on the CPU generator: the same noise for a seed on any device
    pipe.scheduler.set_begin_index(0)
    return DenoiseState(latents, 0, prompt_embeds, negative_embeds, generator, fingerprint)


def denoise_step(pipe, req: GenerationRequest, state: DenoiseState) -> None:
    """Run step ``state.next_step`` in place and advance it by one."""
    i = state.next_step
    t = pipe.scheduler.timesteps[i]
    model = pipe.transformer
    with torch.no_grad():
        latent_in = state.latents.to(model.dtype)
        timestep = t.expand(state.latents.shape[0]).to(latent_in.device)
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
        out[k] = _host_copy(v)
    return out


def snapshot(pipe, state: DenoiseState) -> dict[str, Any]:
    """A self-contained copy of the loop state, CPU tensors only (safe to serialise on another thread)."""
    return {
        "version": SNAPSHOT_VERSION,
        "fingerprint": state.fingerprint,
        "next_step": state.next_step,
        "latents": _host_copy(state.latents),
        "prompt_embeds": _host_copy(state.prompt_embeds),
        "negative_prompt_embeds": None
        if state.negative_prompt_embeds is None
        else _host_copy(state.negative_prompt_embeds),
        "scheduler": _scheduler_state(pipe.scheduler),
        "generator_state": state.generator.get_state().clone(),
        "torch_rng_state": torch.get_rng_state().clone(),
    }


def restore(pipe, snap: dict[str, Any]) -> DenoiseState:
    """Rebuild the loop state from a :func:`snapshot` on the pipeline's device (mutates the pipeline's
    scheduler and the global RNG). Scheduler tensors go back where the scheduler keeps them after
    ``set_timesteps``: the CPU here, except what diffusers' multistep schedulers hold of the model's
    outputs (lists of device tensors, ``last_sample``), which goes to the device."""
    device = device_of(pipe)
    sched = {k: (_to(v, device) if k in _DEVICE_SCHEDULER_STATE else v) for k, v in snap["scheduler"].items()}
    pipe.scheduler.__dict__.update(sched)
    generator = torch.Generator(device="cpu")
    generator.set_state(snap["generator_state"])
    torch.set_rng_state(snap["torch_rng_state"])
    negative = snap["negative_prompt_embeds"]
    return DenoiseState(_to(snap["latents"], device), int(snap["next_step"]), _to(snap["prompt_embeds"], device),
                        None if negative is None else _to(negative, device), generator, snap["fingerprint"])


#: Scheduler attributes that hold model outputs or samples (on the loop's device) in diffusers'
#: multistep schedulers (UniPC, DPM-Solver); everything else they keep is CPU scalars/schedules.
_DEVICE_SCHEDULER_STATE = frozenset({"model_outputs", "last_sample"})


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
