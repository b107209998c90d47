"""A numpy view of node capacity that node-level packing policies work on.

Contract:
- One row per node: free CPU (milli), free memory (MiB), free GPU milli per GPU
  slot (``gpu[n, g]``; slots beyond the node's GPU count are 0 and never chosen),
  the GPU model and the node's capacities.
- :meth:`NodeTable.allocate` (and :meth:`NodeTable.release`, its inverse) are the only
  mutations; ``allocate`` raises ``ValueError`` rather than let any free amount go
  negative or a GPU exceed its 1000 milli.
- :meth:`NodeTable.trial` opens a trial: every row ``allocate``/``release`` touches is
  journalled and restored exactly (free amounts, state id; the ``blocked`` mask is the
  caller's) when the trial closes, so a what-if costs what it touches instead of a
  :meth:`NodeTable.copy`. Trials nest.
- ``topology`` (optional, per node) is the GPUs' pairwise links (:class:`gpufleet.topology.Topology`, ``None``
  unknown): :meth:`NodeTable.pick_gpus` gives a multi-GPU request the free GPUs with the best common links
  (:func:`gpufleet.topology.choose`); unknown, the lowest free indices. It never changes which nodes fit.
- Nodes are *interned* by state (model, free CPU, GPU free values sorted): two
  nodes in the same state share a state id, so fragmentation scores are computed
  once per state and request shape (see :mod:`gpufleet.scheduler.fragmentation`).
The scheduler pass builds one from a snapshot; the simulator builds one from a
trace. Both run the same policies on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from gpufleet.topology import Topology, choose

MILLI = 1000
#: Most GPUs one node may have (the openb trace and our agents stay within 8).
MAX_GPUS = 8


@dataclass(frozen=True)
class Request:
    """What one node of a job needs. ``gpu_milli`` is per GPU (< 1000 only when ``num_gpu == 1``).

    ``gpu_types`` is the set of acceptable GPU models; empty means any.
    """

    cpu_milli: int
    mem_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_types: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.num_gpu < 0 or self.cpu_milli < 0 or self.mem_mib < 0:
            raise ValueError("requests are non-negative")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise ValueError("gpu_milli needs num_gpu >= 1")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= MILLI:
            raise ValueError("gpu_milli must be in (0, 1000]")
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise ValueError("multi-GPU requests take whole GPUs")

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def shape(self) -> tuple:
        """Key of the request's shape (what fragmentation is measured against)."""
        return (self.cpu_milli, self.num_gpu, self.gpu_milli, tuple(sorted(self.gpu_types)))


class NodeTable:
    """Mutable free-capacity table of N nodes (see module docstring)."""

    def __init__(
        self,
        node_ids: Sequence[str],
        models: Sequence[str],
        cpu_cap: Sequence[int],
        mem_cap: Sequence[int],
        gpu_count: Sequence[int],
        *,
        cpu_free: Sequence[int] | None = None,
        mem_free: Sequence[int] | None = None,
        gpu_free: np.ndarray | None = None,
        topology: Sequence[Topology | None] | None = None,
    ) -> None:
        n = len(node_ids)
        self.topology: list[Topology | None] = list(topology) if topology is not None else [None] * n
        self.node_ids = list(node_ids)
        self.model_names: list[str] = sorted(set(models))
        self._model_index = {m: i for i, m in enumerate(self.model_names)}
        self.model = np.array([self._model_index[m] for m in models], dtype=np.int64)
        self.cpu_cap = np.asarray(cpu_cap, dtype=np.int64)
        self.mem_cap = np.asarray(mem_cap, dtype=np.int64)
        self.gpu_count = np.asarray(gpu_count, dtype=np.int64)
        if (self.gpu_count > MAX_GPUS).any() or (self.gpu_count < 0).any():
            raise ValueError(f"nodes have 0..{MAX_GPUS} GPUs")
        self.cpu = np.array(cpu_free if cpu_free is not None else self.cpu_cap, dtype=np.int64)
        self.mem = np.array(mem_free if mem_free is not None else self.mem_cap, dtype=np.int64)
        slots = np.arange(MAX_GPUS)[None, :] < self.gpu_count[:, None]
        if gpu_free is None:
            self.gpu = np.where(slots, MILLI, 0).astype(np.int64)
        else:
            g = np.zeros((n, MAX_GPUS), dtype=np.int64)
            arr = np.asarray(gpu_free, dtype=np.int64)
            g[:, : arr.shape[1]] = arr
            self.gpu = np.where(slots, g, 0)
        self.slots = slots
        #: nodes a caller excludes temporarily (a gang's members go to distinct nodes)
        self.blocked = np.zeros(n, dtype=bool)
        #: undo records of open trials: (node, cpu, mem, gpu row, state id), oldest first
        self._journal: list[tuple[int, int, int, np.ndarray, int]] | None = None
        # state interning
        self._state_index: dict[tuple, int] = {}
        self._st_cpu: list[int] = []
        self._st_model: list[int] = []
        self._st_gpu: list[tuple[int, ...]] = []
        self.state_id = np.zeros(n, dtype=np.int64)
        for i in range(n):
            self.state_id[i] = self._intern(i)

    # -- states ------------------------------------------------------------------
    def _intern(self, i: int) -> int:
        gpus = tuple(sorted(self.gpu[i].tolist(), reverse=True))
        key = (int(self.model[i]), int(self.cpu[i]), gpus)
        sid = self._state_index.get(key)
        if sid is None:
            sid = len(self._st_cpu)
            self._state_index[key] = sid
            self._st_cpu.append(key[1])
            self._st_model.append(key[0])
            self._st_gpu.append(gpus)
        return sid

    @property
    def n_states(self) -> int:
        return len(self._st_cpu)

    def state_arrays(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cpu, gpu[U, G] sorted descending, model) of the given state ids."""
        cpu = np.fromiter((self._st_cpu[i] for i in ids), dtype=np.int64, count=len(ids))
        model = np.fromiter((self._st_model[i] for i in ids), dtype=np.int64, count=len(ids))
        gpu = np.array([self._st_gpu[i] for i in ids], dtype=np.int64).reshape(len(ids), MAX_GPUS)
        return cpu, gpu, model

    # -- queries ---------------------------------------------------------------------
    def type_ok(self, req: Request) -> np.ndarray:
        if not req.gpu_types:
            return np.ones(len(self.node_ids), dtype=bool)
        return self.model_mask(req)[self.model]

    def model_mask(self, req: Request) -> np.ndarray:
        """Boolean per model index: may ``req`` run on that GPU model."""
        if not req.gpu_types:
            return np.ones(len(self.model_names), dtype=bool)
        return np.array([m in req.gpu_types for m in self.model_names], dtype=bool)

    def feasible(self, req: Request) -> np.ndarray:
        """Nodes that can host ``req`` now (CPU, memory, GPU model, enough GPUs with enough free milli)."""
        ok = (self.cpu >= req.cpu_milli) & (self.mem >= req.mem_mib) & ~self.blocked
        if req.num_gpu:
            ok &= self.type_ok(req)
            ok &= ((self.gpu >= req.gpu_milli) & self.slots).sum(axis=1) >= req.num_gpu
        return ok

    def feasible_at(self, n: int, req: Request) -> bool:
        """``feasible(req)[n]``, for one node (O(GPUs) instead of O(nodes))."""
        if self.blocked[n] or self.cpu[n] < req.cpu_milli or self.mem[n] < req.mem_mib:
            return False
        if req.num_gpu:
            if req.gpu_types and self.model_names[self.model[n]] not in req.gpu_types:
                return False
            return int(((self.gpu[n] >= req.gpu_milli) & self.slots[n]).sum()) >= req.num_gpu
        return True

    def pick_gpus(self, n: int, req: Request, take_from: int | None = None) -> tuple[int, ...]:
        """GPU indices on node ``n`` for ``req``: the tightest GPUs that still fit, lowest index first.

        ``take_from`` (shares only) asks for a GPU whose free milli equals that value.
        """
        if req.num_gpu == 0:
            return ()
        free = self.gpu[n]
        idx = [g for g in range(int(self.gpu_count[n])) if free[g] >= req.gpu_milli]
        if take_from is not None:
            idx = [g for g in idx if free[g] == take_from] or idx
        idx.sort(key=lambda g: (int(free[g]), g))
        if len(idx) < req.num_gpu:
            raise ValueError(f"node {self.node_ids[n]} cannot host {req}")
        if req.num_gpu > 1:  # whole GPUs, all equally tight: the best-linked set (lowest indices when unknown)
            return choose(idx, req.num_gpu, self.topology[n])
        return tuple(sorted(idx[: req.num_gpu]))

    def allocate(self, n: int, gpus: Sequence[int], req: Request) -> None:
        """Take ``req`` from node ``n`` on GPUs ``gpus``; raises ValueError if it does not fit."""
        if len(gpus) != req.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError("one distinct GPU index per requested GPU")
        if self.cpu[n] < req.cpu_milli or self.mem[n] < req.mem_mib:
            raise ValueError("not enough CPU or memory")
        for g in gpus:
            if not (0 <= g < self.gpu_count[n]) or self.gpu[n, g] < req.gpu_milli:
                raise ValueError(f"GPU {g} of {self.node_ids[n]} cannot take {req.gpu_milli} milli")
        self._record(n)
        self.cpu[n] -= req.cpu_milli
        self.mem[n] -= req.mem_mib
        for g in gpus:
            self.gpu[n, g] -= req.gpu_milli
        self.state_id[n] = self._intern(n)

    def release(self, n: int, gpus: Sequence[int], req: Request) -> None:
        """Give back what :meth:`allocate` took (CPU and memory capped at the node's capacity)."""
        self._record(n)
        self.cpu[n] = min(self.cpu[n] + req.cpu_milli, self.cpu_cap[n])
        self.mem[n] = min(self.mem[n] + req.mem_mib, self.mem_cap[n])
        for g in gpus:
            if self.gpu[n, g] + req.gpu_milli > MILLI:
                raise ValueError("release would exceed the GPU's capacity")
            self.gpu[n, g] += req.gpu_milli
        self.state_id[n] = self._intern(n)

    # -- trials ----------------------------------------------------------------------
    def _record(self, n: int) -> None:
        if self._journal is not None:
            self._journal.append((n, int(self.cpu[n]), int(self.mem[n]), self.gpu[n].copy(), int(self.state_id[n])))

    @contextmanager
    def trial(self) -> Iterator[NodeTable]:
        """Mutations inside the ``with`` block are undone when it exits (see module docstring)."""
        outer = self._journal
        if outer is None:
            self._journal = []
        mark = len(self._journal)
        try:
            yield self
        finally:
            journal = self._journal
            while len(journal) > mark:
                n, cpu, mem, gpu, sid = journal.pop()
                self.cpu[n], self.mem[n], self.state_id[n] = cpu, mem, sid
                self.gpu[n] = gpu
            if outer is None:
                self._journal = None

    def allocated_gpu_milli(self) -> int:
        return int((self.gpu_count * MILLI).sum() - self.gpu.sum())

    def copy(self) -> NodeTable:
        other = object.__new__(NodeTable)
        other.__dict__.update(self.__dict__)
        other.cpu, other.mem, other.gpu, other.state_id, other.blocked = (
            self.cpu.copy(),
            self.mem.copy(),
            self.gpu.copy(),
            self.state_id.copy(),
            self.blocked.copy(),
        )
        other._state_index = self._state_index  # interning is shared and append-only
        other._journal = None  # a copy starts outside any trial
        return other
