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
#: rows every transformer call on a GPU is padded to (0: none; :func:`set_pad_rows`). A GPU's kernels choose their
#: algorithm by the call's shape, so a batch member's rows differ from the same job run alone (by ~1e-6 on an H200,
#: docs/benchmarks.md "Runtime: batching"); with every call padded to one shape — single jobs too, both guidance
#: branches in one call — each row is computed as it would be in any batch: bitwise equal (measured on the H200).
#: On the CPU rows are batch-invariant as they are (tested), so no padding there.
_pad_rows = 0
#: the device types padded (tests add "cpu" to exercise the padded path, whose rows are equal there anyway)
PAD_DEVICES: tuple[str, ...] = ("cuda",)


def set_pad_rows(rows: int) -> None:
    """Pad every later transformer call on a GPU to ``rows`` rows (a warm worker that batches: twice its largest
    batch, ``GPUFLEET_BATCH_PAD_ROWS`` from the agent, :mod:`gpufleet.runtime.worker`); 0 turns padding off."""
    global _pad_rows
    if rows < 0:
        raise ValueError("pad rows must be >= 0")
    _pad_rows = int(rows)


def _pads(state: DenoiseState) -> bool:
    return _pad_rows > 0 and state.latents.device.type in PAD_DEVICES


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
    #: the member's own scheduler in a batch (:func:`own_scheduler`); None: the pipeline's (a job alone)
    scheduler: Any = None


def _sched(pipe, state: DenoiseState):
    return state.scheduler if state.scheduler is not None else pipe.scheduler


def own_scheduler(pipe, state: DenoiseState) -> DenoiseState:
    """Give ``state`` a private copy of the pipeline's scheduler as it is now (right after :func:`start` or
    :func:`restore`), so that several states can step through one pipeline (a batch)."""
    state.scheduler = copy.deepcopy(pipe.scheduler)
    return state


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
    if _pads(state):
        _batch_step(pipe, [(req, state)])
        return
    i = state.next_step
    scheduler = _sched(pipe, state)
    t = scheduler.timesteps[i]
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
        state.latents = scheduler.step(noise, t, state.latents, generator=state.generator, return_dict=False)[0]
    state.next_step = i + 1


def denoise_batch_step(pipe, members: list[tuple[GenerationRequest, DenoiseState]]) -> None:
    """Run each member's next step (each state at its own step index, with its own scheduler and generator)
    as one transformer call over the whole batch (both guidance branches), then each member's
    ``scheduler.step``; every state advances by one. A batch of one is :func:`denoise_step`.

    Each member's result is bitwise what :func:`denoise_step` gives it alone (on the CPU, tested): the
    transformer's per-sample layers (blocks, norms, attention) give the same rows whatever the batch, and
    the two that do not (the patch embedding's convolution and the timestep embedder, whose kernels depend
    on the batch size) run one sample at a time (:func:`_batch_invariant`). All members must share the
    guidance setting (the batch key, :func:`gpufleet.batching.batch_key`)."""
    if len(members) == 1:
        denoise_step(pipe, *members[0])
        return
    _batch_step(pipe, members)


def _padded(model, latent_in, timestep, embeds):
    """One transformer call, on a GPU its rows padded with zeros to :data:`_pad_rows` (when set) and the padding's
    rows dropped."""
    n = latent_in.shape[0]
    if latent_in.device.type in PAD_DEVICES and _pad_rows > n:
        def pad(x):
            return torch.cat([x, x.new_zeros((_pad_rows - n, *x.shape[1:]))])

        latent_in, timestep, embeds = pad(latent_in), pad(timestep), pad(embeds)
    return model(hidden_states=latent_in, timestep=timestep, encoder_hidden_states=embeds, return_dict=False)[0][:n]


def _batch_step(pipe, members: list[tuple[GenerationRequest, DenoiseState]]) -> None:
    cfg = {_cfg(req) for req, _ in members}
    if len(cfg) != 1:
        raise ValueError("a batch mixes guided and unguided members")
    guided = cfg.pop()
    model = pipe.transformer
    n = len(members)
    with torch.no_grad(), _batch_invariant(model):
        steps = [_sched(pipe, st).timesteps[st.next_step] for _, st in members]
        latents = torch.cat([st.latents for _, st in members])
        latent_in = latents.to(model.dtype)
        timestep = torch.stack([t.reshape(()) for t in steps]).to(latent_in.device)
        embeds = [st.prompt_embeds for _, st in members]
        if guided:
            latent_in = torch.cat([latent_in, latent_in])
            timestep = torch.cat([timestep, timestep])
            embeds += [st.negative_prompt_embeds for _, st in members]
        out = _padded(model, latent_in, timestep, torch.cat(embeds))
        for k, (req, st) in enumerate(members):
            noise = out[k:k + 1]
            if guided:
                uncond = out[n + k:n + k + 1]
                noise = uncond + req.guidance * (noise - uncond)
            st.latents = _sched(pipe, st).step(noise, steps[k], st.latents, generator=st.generator,
                                               return_dict=False)[0]
            st.next_step += 1


def member_bytes_for(pipe, req: GenerationRequest) -> int:
    """One batch member's transient memory in a step of ``pipe`` for ``req``
    (:func:`gpufleet.batching.member_bytes` over the transformer's configuration)."""
    from gpufleet.batching import member_bytes

    cfg = pipe.transformer.config
    p_t, p_h, p_w = cfg.patch_size
    frames = (req.frames - 1) // int(getattr(pipe, "vae_scale_factor_temporal", 4)) + 1
    spatial = int(getattr(pipe, "vae_scale_factor_spatial", 8))
    tokens = max(1, frames // p_t) * max(1, req.height // spatial // p_h) * max(1, req.width // spatial // p_w)
    heads = int(cfg.num_attention_heads)
    return member_bytes(tokens=tokens, text_tokens=req.max_sequence_length, inner_dim=heads * int(cfg.attention_head_dim),
                        ffn_dim=int(cfg.ffn_dim), heads=heads, guidance=_cfg(req),
                        dtype_bytes=torch.finfo(pipe.transformer.dtype).bits // 8)


class _batch_invariant:
    """Within it, the transformer's patch embedding and condition embedder run one sample at a time (see
    :func:`denoise_batch_step`); outside, the modules are as loaded."""

    _PARTS = ("patch_embedding", "condition_embedder")

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self):
        for name in self._PARTS:
            module = getattr(self.model, name)
            module.forward = _per_sample(module.forward)
        return self

    def __exit__(self, *exc) -> None:
        for name in self._PARTS:
            del getattr(self.model, name).forward  # back to the class's forward


def _per_sample(forward):
    def run(x, *args, **kwargs):
        if x.shape[0] == 1:
            return forward(x, *args, **kwargs)
        outs = [forward(x[i:i + 1], *[a[i:i + 1] if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
                for i in range(x.shape[0])]
        if isinstance(outs[0], tuple):
            return tuple(None if parts[0] is None else torch.cat(list(parts)) for parts in zip(*outs, strict=True))
        return torch.cat(outs)

    return run


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
        "scheduler": _scheduler_state(_sched(pipe, state)),
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
