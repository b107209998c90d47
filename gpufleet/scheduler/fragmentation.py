"""GPU fragmentation of a node measured against a task-shape mix (FGD, ATC'23), vectorised.

Definitions (as in the paper and its simulator):
- A *task mix* is a set of task classes ``t`` (CPU milli ``c_t``, GPU count ``k_t``,
  per-GPU milli ``m_t``, acceptable GPU models) with popularity ``p_t`` (sums to 1).
- For a node and a class: if the class asks no GPU, or cannot run on the node
  (wrong GPU model, not enough CPU, fewer than ``k_t`` GPUs with ``>= m_t`` free),
  all the node's free GPU milli is fragmented; otherwise the free milli of the
  GPUs with less than ``m_t`` free is.
- The node's fragmentation is the popularity-weighted sum over classes.
FGD places a task where fragmentation grows least (``after - before`` smallest).

Memory is not part of the measure (the paper's model); it is a hard filter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpufleet.scheduler.nodetable import MILLI, NodeTable, Request


@dataclass(frozen=True)
class TaskMix:
    """Task classes and their popularity (see module docstring)."""

    cpu: np.ndarray  # (T,)
    num_gpu: np.ndarray  # (T,)
    milli: np.ndarray  # (T,)
    types: tuple[frozenset[str], ...]
    p: np.ndarray  # (T,) sums to 1

    @classmethod
    def from_requests(cls, reqs: Iterable[Request], coverage: float = 0.95) -> TaskMix:
        """The most popular shapes covering ``coverage`` of the requests (FGD's "typical pods", 95 %)."""
        counts = Counter(r.shape for r in reqs)
        if not counts:
            raise ValueError("a task mix needs at least one request")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        chosen, cum = [], 0
        for shape, c in ranked:
            chosen.append((shape, c))
            cum += c
            if cum >= coverage * total:
                break
        p = np.array([c for _, c in chosen], dtype=float)
        return cls(
            cpu=np.array([s[0] for s, _ in chosen], dtype=np.int64),
            num_gpu=np.array([s[1] for s, _ in chosen], dtype=np.int64),
            milli=np.array([s[2] for s, _ in chosen], dtype=np.int64),
            types=tuple(frozenset(s[3]) for s, _ in chosen),
            p=p / p.sum(),
        )

    def access(self, model_names: list[str]) -> np.ndarray:
        """(n_models, T): may class t run on model m."""
        return np.array([[not t or m in t for t in self.types] for m in model_names], dtype=bool)


def frag_of(cpu: np.ndarray, gpu: np.ndarray, model: np.ndarray, mix: TaskMix, access: np.ndarray) -> np.ndarray:
    """Fragmentation (GPU milli) of U node states: ``cpu`` (U,), ``gpu`` (U, G), ``model`` (U,)."""
    total = gpu.sum(axis=1)
    lt = gpu[:, :, None] < mix.milli[None, None, :]  # (U, G, T)
    small = (gpu[:, :, None] * lt).sum(axis=1)  # (U, T)
    enough = (~lt).sum(axis=1)  # GPUs with >= m_t free (absent slots are 0: < m_t for GPU classes)
    fits = access[model] & (cpu[:, None] >= mix.cpu[None, :]) & (enough >= mix.num_gpu[None, :])
    per_class = np.where((mix.milli[None, :] > 0) & fits, small, total[:, None])
    return per_class @ mix.p


def share_after(cpu: np.ndarray, gpu: np.ndarray, model: np.ndarray, req: Request, mix: TaskMix, access: np.ndarray) -> np.ndarray:
    """Fragmentation after placing share request ``req`` on each GPU slot: (U, G); +inf where it does not fit."""
    m = req.gpu_milli
    cpu2 = cpu - req.cpu_milli
    total2 = gpu.sum(axis=1) - m  # (U,)
    lt = gpu[:, :, None] < mix.milli[None, None, :]  # (U, G, T)
    small = (gpu[:, :, None] * lt).sum(axis=1)  # (U, T)
    enough = (~lt).sum(axis=1)  # (U, T)
    new = gpu - m  # (U, G)
    lt2 = new[:, :, None] < mix.milli[None, None, :]  # (U, G, T)
    small2 = small[:, None, :] - gpu[:, :, None] * lt + new[:, :, None] * lt2
    enough2 = enough[:, None, :] - (~lt) + (~lt2)
    fits = (
        access[model][:, None, :]
        & (cpu2[:, None, None] >= mix.cpu[None, None, :])
        & (enough2 >= mix.num_gpu[None, None, :])
        & (mix.milli[None, None, :] > 0)
    )
    per_class = np.where(fits, small2, total2[:, None, None])
    out = per_class @ mix.p  # (U, G)
    return np.where(gpu >= m, out, np.inf)


def whole_after(table: NodeTable, cpu: np.ndarray, gpu: np.ndarray, model: np.ndarray, req: Request) -> np.ndarray:
    """GPU free rows after taking ``req`` (whole GPUs or none) from sorted-descending rows ``gpu`` (U, G)."""
    out = gpu.copy()
    if req.num_gpu:
        # rows are sorted descending: the last num_gpu slots with free >= milli are the tightest fits
        ok = gpu >= req.gpu_milli
        # rank of each eligible slot from the right (tightest first)
        rank_from_right = np.cumsum(ok[:, ::-1], axis=1)[:, ::-1]
        take = ok & (rank_from_right <= req.num_gpu)
        out = out - take * req.gpu_milli
    return out


class FragScorer:
    """Per-state fragmentation and placement deltas, cached by node state and request shape.

    ``delta(table, req, node_mask)`` returns, for every node, the fragmentation
    growth of the best placement of ``req`` on it (``+inf`` where not allowed) and,
    for shares, the free milli of the GPU that placement takes from.
    """

    def __init__(self, mix: TaskMix) -> None:
        self.mix = mix
        self._access: np.ndarray | None = None
        self._models: list[str] | None = None
        self._before: dict[int, float] = {}
        self._delta: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def reset(self, mix: TaskMix) -> None:
        self.mix = mix
        self._access = None
        self._before.clear()
        self._delta.clear()

    def _acc(self, table: NodeTable) -> np.ndarray:
        if self._access is None or self._models != table.model_names:
            self._models = list(table.model_names)
            self._access = self.mix.access(self._models)
        return self._access

    def delta(self, table: NodeTable, req: Request, node_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        access = self._acc(table)
        key = req.shape
        if key not in self._delta:
            self._delta[key] = (np.full(0, np.nan), np.full(0, -1, dtype=np.int64))
        dvals, takes = self._delta[key]
        if len(dvals) < table.n_states:
            grow = max(table.n_states, 2 * len(dvals), 64)
            dvals = np.concatenate([dvals, np.full(grow - len(dvals), np.nan)])
            takes = np.concatenate([takes, np.full(grow - len(takes), -1, dtype=np.int64)])
            self._delta[key] = (dvals, takes)
        sids = table.state_id[node_mask]
        need = np.unique(sids[np.isnan(dvals[sids])])
        if len(need):
            cpu, gpu, model = table.state_arrays(need)
            before = frag_of(cpu, gpu, model, self.mix, access)
            if req.is_share:
                after = share_after(cpu, gpu, model, req, self.mix, access)
                best = np.argmin(after, axis=1)
                dvals[need] = after[np.arange(len(need)), best] - before
                takes[need] = gpu[np.arange(len(need)), best]
            else:
                gpu2 = whole_after(table, cpu, gpu, model, req)
                dvals[need] = frag_of(cpu - req.cpu_milli, gpu2, model, self.mix, access) - before
        out = np.full(len(table.node_ids), np.inf)
        out[node_mask] = dvals[table.state_id[node_mask]]
        take = np.full(len(table.node_ids), -1, dtype=np.int64)
        take[node_mask] = takes[table.state_id[node_mask]]
        return out, take


def cluster_frag(table: NodeTable, mix: TaskMix) -> float:
    """Total fragmentation of the cluster (GPU milli) — for reporting."""
    ids = np.arange(len(table.node_ids))
    cpu, gpu, model = table.cpu, np.sort(table.gpu, axis=1)[:, ::-1], table.model
    del ids
    return float(frag_of(cpu, gpu, model, mix, mix.access(table.model_names)).sum())


__all__ = ["MILLI", "TaskMix", "FragScorer", "frag_of", "share_after", "whole_after", "cluster_frag"]
