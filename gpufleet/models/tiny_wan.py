"""The tiny Wan text-to-video model, built offline (tests and the demo).

Contract: :func:`build_tiny_wan` returns a ``diffusers.WanPipeline`` whose
components follow diffusers' own tiny Wan test configuration, with a
``T5Tokenizer`` built from an in-memory vocabulary and a randomly initialised
``UMT5EncoderModel``. Weights depend only on ``seed``. Nothing is downloaded.
:func:`save_tiny_wan` writes it with ``save_pretrained`` (atomically: temp
folder, then rename) and returns the folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from gpufleet.models.limits import TINY_MODEL, TINY_ROPE_MAX_SEQ_LEN

TINY_MODEL_NAME = TINY_MODEL

# A small word-piece vocabulary: enough to tokenise prompts into distinct ids.
_WORDS = (
    "a an the of in on at with and or to from by for is are red blue green yellow white black orange purple "
    "cat dog fox bird fish horse cow city street forest river sea ocean mountain snow rain sun moon night day "
    "running walking flying swimming jumping dancing sitting slowly quickly over under near big small old young "
    "person man woman child car train boat house tree flower sky cloud light fire water field road bridge"
).split()


def _vocab() -> list[tuple[str, float]]:
    pieces = ["<pad>", "</s>", "<unk>"] + [f"\u2581{w}" for w in _WORDS] + ["\u2581"] + list("abcdefghijklmnopqrstuvwxyz0123456789")
    return [(p, 0.0 if i < 3 else -float(i)) for i, p in enumerate(pieces)]


def build_tiny_wan(seed: int = 0):
    """Build the tiny ``WanPipeline`` in memory (CPU, float32)."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    tokenizer = T5Tokenizer(vocab=_vocab(), extra_ids=0)
    cfg = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(cfg)
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=TINY_ROPE_MAX_SEQ_LEN,  # limits frames (gpufleet.models.limits)
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)
    pipe = WanPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer
    )
    for module in (text_encoder, vae, transformer):
        module.eval()  # freshly built modules are in training mode (dropout); from_pretrained gives eval
    pipe.set_progress_bar_config(disable=True)
    return pipe


#: Model construction in a process, one at a time: loading a diffusers pipeline builds its modules under
#: process-wide construction hooks (parameters made on the meta device, then filled), so a model built on another
#: thread meanwhile gets meta tensors ("Cannot copy out of meta tensor" — seen when a warm worker's batch members
#: resolved and loaded the model together). Held by :func:`save_tiny_wan` and by
#: :func:`gpufleet.models.loader.load_pipeline`.
MODEL_CONSTRUCTION_LOCK = threading.RLock()


def save_tiny_wan(folder: str | os.PathLike, seed: int = 0) -> Path:
    """Save the tiny model to ``folder`` (a no-op if a complete copy is already there); under
    :data:`MODEL_CONSTRUCTION_LOCK` (a thread that waited finds the copy the other one saved)."""
    dest = Path(folder)
    if (dest / "model_index.json").exists():
        return dest
    with MODEL_CONSTRUCTION_LOCK:
        return _save_tiny_wan(dest, seed)


def _save_tiny_wan(dest: Path, seed: int) -> Path:
    if (dest / "model_index.json").exists():
        return dest
    import diffusers

    diffusers.utils.logging.disable_progress_bar()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-wan-", dir=dest.parent))
    try:
        build_tiny_wan(seed).save_pretrained(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            # Another process won the race: its copy is identical.
            if not (dest / "model_index.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
