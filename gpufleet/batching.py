"""Batching text-to-video jobs: which jobs may share a denoising batch, how waiting jobs are grouped, how
many members a batch may hold, and how the batch's GPU time is split among its members (pure; no I/O).

Contract:
- :func:`batch_key` is the compatibility key of a spec: jobs with equal keys can run their denoising
  steps as one batch on one warm worker. It is ``None`` (never batched) for anything but
  ``video.generate``. The key holds everything the batched loop must share: the model (its scheduler
  comes with it), the requested size, frames, steps and guidance; prompts, negative prompts and seeds
  differ freely (each member keeps its own embeddings and generator).
- :func:`group` partitions items in arrival order into batches: each batch starts with the oldest item
  not yet placed and takes the following items with the same (non-None) key, up to ``max_members``;
  an item without a key is a batch of one. Every item lands in exactly one batch, order within a
  batch is arrival order, and no batch mixes keys.
- :func:`member_bytes` estimates one member's transient memory in the transformer (activations of a
  step, both guidance branches); :func:`capacity` bounds a batch by the configured maximum and by
  ``free_bytes // per_member`` (at least 1: a job that runs alone runs as today).
- :class:`ShareLedger` splits the batch's GPU time: each interval (e.g. one batched step) of ``seconds``
  with ``n`` members adds ``seconds / n`` to each member's share, so the shares always add up to the
  recorded time. The same ledger bills a batch: fed with the intervals between members arriving and leaving and
  the members present in each, the members' GPU-seconds add up to the batch's wall time
  (:mod:`gpufleet.runtime.batchloop`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpufleet.spec import JobSpec, VideoGenerate

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, order=True)
class BatchKey:
    model: str
    width: int
    height: int
    frames: int
    steps: int
    guidance: float


def batch_key(spec: JobSpec | None) -> BatchKey | None:
    """The compatibility key of ``spec`` (see module contract)."""
    if spec is None or not isinstance(spec.workload, VideoGenerate):
        return None
    w = spec.workload
    return BatchKey(
        model=w.model, width=w.width, height=w.height, frames=w.frames, steps=w.steps, guidance=float(w.guidance)
    )


def group(items: Sequence[T], key: Callable[[T], K | None], max_members: int) -> list[list[T]]:
    """Batches of ``items`` in arrival order (see module contract)."""
    if max_members < 1:
        raise ValueError("max_members must be at least 1")
    keys = [key(item) for item in items]
    placed = [False] * len(items)
    out: list[list[T]] = []
    for i, item in enumerate(items):
        if placed[i]:
            continue
        placed[i] = True
        batch = [item]
        if keys[i] is not None:
            for j in range(i + 1, len(items)):
                if len(batch) >= max_members:
                    break
                if not placed[j] and keys[j] == keys[i]:
                    placed[j] = True
                    batch.append(items[j])
        out.append(batch)
    return out


def member_bytes(
    *, tokens: int, text_tokens: int, inner_dim: int, ffn_dim: int, heads: int, guidance: bool, dtype_bytes: int = 4
) -> int:
    """One member's transient memory in one batched step (see module contract): per branch, the hidden
    states and their projections (q, k, v, out, residuals: ~8 × inner_dim a token), the feed-forward's
    intermediate (2 × ffn_dim a token), the attention scores of self- and cross-attention (the math kernel
    materialises them: heads × tokens × (tokens + text_tokens)); twice with classifier-free guidance."""
    if tokens < 1 or inner_dim < 1:
        raise ValueError("tokens and inner_dim must be positive")
    per_branch = tokens * (8 * inner_dim + 2 * ffn_dim) + heads * tokens * (tokens + text_tokens)
    return int(per_branch * dtype_bytes * (2 if guidance else 1))


def capacity(max_members: int, free_bytes: int | None, per_member: int) -> int:
    """How many members a batch may hold (see module contract); ``free_bytes`` None: no memory bound."""
    if max_members < 1:
        raise ValueError("max_members must be at least 1")
    if free_bytes is None or per_member <= 0:
        return max_members
    return max(1, min(max_members, free_bytes // per_member))


class ShareLedger:
    """GPU-seconds of a batch's rounds split among their members (see module contract)."""

    def __init__(self) -> None:
        self._share: dict[Hashable, float] = {}
        self._rounds: dict[Hashable, float] = {}
        self._steps: dict[Hashable, int] = {}
        self._widest: dict[Hashable, int] = {}
        self.total_s = 0.0

    def record(self, seconds: float, members: Iterable[Hashable]) -> None:
        """One round of ``seconds`` shared by ``members``."""
        ids = list(dict.fromkeys(members))
        if not ids:
            return
        seconds = max(0.0, float(seconds))
        self.total_s += seconds
        for m in ids:
            self._share[m] = self._share.get(m, 0.0) + seconds / len(ids)
            self._rounds[m] = self._rounds.get(m, 0.0) + seconds
            self._steps[m] = self._steps.get(m, 0) + 1
            self._widest[m] = max(self._widest.get(m, 0), len(ids))

    def share_s(self, member: Hashable) -> float:
        """The member's part of the rounds' GPU time."""
        return self._share.get(member, 0.0)

    def rounds_s(self, member: Hashable) -> float:
        """The wall time of the rounds the member took part in."""
        return self._rounds.get(member, 0.0)

    def steps(self, member: Hashable) -> int:
        return self._steps.get(member, 0)

    def widest(self, member: Hashable) -> int:
        """The most members any of its rounds had."""
        return self._widest.get(member, 0)
