"""GPU topology within a node and the choice of a multi-GPU set from it (pure; no NVML here).

Contract:
- A link between two GPUs has a level, best first (:data:`LEVELS`): ``nvlink`` (NVML reports NVLink
  peer-to-peer between them, directly or through an NVSwitch), then NVML's common-ancestor levels:
  ``board`` (the same board), ``pcie-switch`` (one PCIe switch), ``pcie-switches`` (several switches, no
  host bridge), ``host-bridge`` (the same host bridge), ``numa-node`` (the same CPU socket's root
  complexes), ``system`` (across sockets).
- :class:`Topology` is the matrix of a node's GPUs (``indices``, in the node's device order) and encodes to a
  compact string (:meth:`Topology.code`): one letter per pair, upper triangle row by row
  (``(0,1), (0,2), …, (1,2), …``), so 8 GPUs are 28 characters. :meth:`Topology.parse` is its inverse and
  refuses a string of the wrong length or with unknown letters (``None``: unknown, never guessed).
- :func:`choose` picks ``n`` GPUs among ``free``: with a topology, the set whose worst pairwise link is best,
  then whose links sum best, then the lowest indices; without one, the ``n`` lowest free indices. It never
  returns a GPU outside ``free`` and returns exactly ``n`` (``ValueError`` when ``free`` has fewer). It tries
  every set while there are at most :data:`EXHAUSTIVE_MAX` of them (always, for 8 GPUs), so it returns a
  full-NVLink set whenever one exists among the free GPUs; beyond that it grows a set from each free GPU
  greedily (best link to the set so far).
- :func:`link_of` is the worst link level within a chosen set: ``unknown`` without a topology, ``""`` for one
  GPU (no link to speak of). The scheduler records it on the placement (``gpu_link``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

#: link levels, best first, with their one-letter codes
LEVELS: tuple[str, ...] = ("nvlink", "board", "pcie-switch", "pcie-switches", "host-bridge", "numa-node", "system")
CODES = "NBSMHUX"
_RANK = {c: i for i, c in enumerate(CODES)}
UNKNOWN = "unknown"
#: the most candidate sets :func:`choose` compares exhaustively
EXHAUSTIVE_MAX = 20_000


@dataclass(frozen=True)
class Topology:
    """Pairwise link levels of a node's GPUs (see the module contract)."""

    indices: tuple[int, ...]
    links: Mapping[tuple[int, int], str]  # (a, b) with a < b -> a level of LEVELS

    def level(self, a: int, b: int) -> str:
        return self.links[(a, b) if a < b else (b, a)]

    def rank(self, a: int, b: int) -> int:
        return LEVELS.index(self.level(a, b))

    def code(self) -> str:
        return "".join(CODES[LEVELS.index(self.level(a, b))] for a, b in combinations(self.indices, 2))

    @classmethod
    def parse(cls, indices: Sequence[int], code: str) -> Topology | None:
        """The topology of ``indices`` from :meth:`code`'s string; ``None`` when it does not fit them."""
        idx = tuple(indices)
        pairs = list(combinations(idx, 2))
        if len(code) != len(pairs) or len(idx) < 2 or any(c not in _RANK for c in code):
            return None
        return cls(idx, {p: LEVELS[_RANK[c]] for p, c in zip(pairs, code, strict=True)})

    @classmethod
    def of(cls, indices: Sequence[int], level: Mapping[tuple[int, int], str]) -> Topology:
        idx = tuple(indices)
        return cls(idx, {(a, b): level[(a, b)] for a, b in combinations(idx, 2)})


def _score(topo: Topology, gpus: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
    ranks = [topo.rank(a, b) for a, b in combinations(gpus, 2)]
    return (max(ranks, default=0), sum(ranks), tuple(gpus))


def _greedy(topo: Topology, free: list[int], n: int) -> tuple[int, ...]:
    best: tuple[int, int, tuple[int, ...]] | None = None
    for seed in free:
        chosen = [seed]
        while len(chosen) < n:
            rest = [g for g in free if g not in chosen]
            nxt = min(
                rest, key=lambda g: (max(topo.rank(g, c) for c in chosen), sum(topo.rank(g, c) for c in chosen), g)
            )
            chosen.append(nxt)
        s = _score(topo, sorted(chosen))
        if best is None or s < best:
            best = s
    assert best is not None
    return best[2]


def choose(free: Iterable[int], n: int, topo: Topology | None) -> tuple[int, ...]:
    """``n`` GPUs of ``free`` (see the module contract), sorted."""
    pool = sorted(set(free))
    if n < 0 or n > len(pool):
        raise ValueError(f"{n} GPUs asked, {len(pool)} free")
    known = topo is not None and all(g in topo.indices for g in pool)
    if n <= 1 or not known:
        return tuple(pool[:n])
    assert topo is not None
    if comb(len(pool), n) <= EXHAUSTIVE_MAX:
        return min(_score(topo, c) for c in combinations(pool, n))[2]
    return _greedy(topo, pool, n)


def link_of(gpus: Sequence[int], topo: Topology | None) -> str:
    """The worst link level within ``gpus`` (``unknown`` without a topology that covers them; ``""`` for one)."""
    if len(gpus) < 2:
        return ""
    if topo is None or any(g not in topo.indices for g in gpus):
        return UNKNOWN
    return LEVELS[_score(topo, gpus)[0]]
