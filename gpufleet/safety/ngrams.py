"""Hashed character n-grams of normalised text: lexical features the tier-1 head reads beside the sentence
embedding (pure numpy, deterministic).

Contract: ``hashed_ngrams(texts, dims, sizes) -> SparseRows``: for each text (already normalised by
:func:`gpufleet.safety.normalize.normalize`), every character n-gram of each size in ``sizes`` of the text padded
with one space each side, hashed with CRC-32 into ``dims`` buckets (a power of two); a row's value is 1 per bucket
present, the row scaled to unit length (an empty text is an all-zero row). The same text always gives the same row,
in any process. :class:`SparseRows` holds the rows in compressed-row form and multiplies them by a dense matrix
(``rows @ W``) and its transpose by one (``rows.T @ G``), which is all the head needs to fit and score.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class SparseRows:
    indices: np.ndarray  # (nnz,) int64 bucket of each stored value
    values: np.ndarray  # (nnz,) float32
    row_ptr: np.ndarray  # (rows + 1,) int64: row i is indices[row_ptr[i]:row_ptr[i + 1]]
    dims: int

    def __len__(self) -> int:
        return len(self.row_ptr) - 1

    @cached_property
    def row_ids(self) -> np.ndarray:
        return np.repeat(np.arange(len(self)), np.diff(self.row_ptr))

    @cached_property
    def _row_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the rows with at least one value, where each starts): the segments ``np.add.reduceat`` sums."""
        nonempty = np.flatnonzero(np.diff(self.row_ptr) > 0)
        return nonempty, self.row_ptr[nonempty]

    @cached_property
    def _by_bucket(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(the stored values' order sorted by bucket, their rows in that order, each bucket group's start in it,
        the group's bucket)."""
        order = np.argsort(self.indices, kind="stable")
        ordered = self.indices[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else np.zeros(0, int)
        return order, self.row_ids[order], starts, ordered[starts]

    @cached_property
    def _uniform(self) -> np.ndarray | None:
        """Per row its one value when every value of each row is the same (rows made by :func:`hashed_ngrams`),
        else None."""
        rows, starts = self._row_starts
        per_row = np.zeros(len(self), dtype=np.float32)
        if len(rows):
            per_row[rows] = self.values[starts]
        return per_row if np.array_equal(self.values, per_row[self.row_ids]) else None

    def take(self, rows: np.ndarray | Iterable[int]) -> SparseRows:
        """The rows at ``rows`` (in that order; repeats allowed)."""
        rows = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows))
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64)
        starts, ends = self.row_ptr[rows], self.row_ptr[rows + 1]
        lengths = ends - starts
        ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        pick = np.repeat(starts - ptr[:-1], lengths) + np.arange(ptr[-1])
        return SparseRows(self.indices[pick], self.values[pick], ptr, self.dims)

    def matmul(self, w: np.ndarray) -> np.ndarray:
        """``rows @ w`` for a dense (dims, k) ``w``: (rows, k)."""
        out = np.zeros((len(self), w.shape[1]), dtype=np.float32)
        rows, starts = self._row_starts
        if len(rows):
            uniform = self._uniform
            if uniform is not None:  # sum the gathered weights, then scale each row once
                out[rows] = np.add.reduceat(np.take(w, self.indices, axis=0), starts, axis=0) * uniform[rows, None]
            else:
                out[rows] = np.add.reduceat(np.take(w, self.indices, axis=0) * self.values[:, None], starts, axis=0)
        return out

    def t_matmul(self, g: np.ndarray) -> np.ndarray:
        """``rows.T @ g`` for a dense (rows, k) ``g``: (dims, k)."""
        out = np.zeros((self.dims, g.shape[1]), dtype=np.float32)
        order, rows, starts, buckets = self._by_bucket
        if len(order):
            uniform = self._uniform
            if uniform is not None:
                per = np.take(np.asarray(g, dtype=np.float32) * uniform[:, None], rows, axis=0)
            else:
                per = np.take(g, rows, axis=0) * self.values[order, None]
            out[buckets] = np.add.reduceat(per, starts, axis=0)
        return out


def grams(text: str, sizes: Iterable[int]) -> list[str]:
    padded = f" {text} "
    return [padded[i : i + n] for n in sizes for i in range(len(padded) - n + 1)]


def hashed_ngrams(texts: Iterable[str], dims: int, sizes: Iterable[int] = (3, 4, 5)) -> SparseRows:
    if dims <= 0 or dims & (dims - 1):
        raise ValueError("dims must be a power of two")
    sizes = tuple(sizes)
    mask = dims - 1
    indices: list[np.ndarray] = []
    ptr = [0]
    for text in texts:
        buckets = (
            np.unique(np.fromiter((zlib.crc32(g.encode("utf-8")) & mask for g in grams(text, sizes)), dtype=np.int64))
            if text
            else np.zeros(0, dtype=np.int64)
        )
        indices.append(buckets)
        ptr.append(ptr[-1] + len(buckets))
    idx = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    lengths = np.diff(ptr)
    vals = np.repeat(1.0 / np.sqrt(np.maximum(lengths, 1)), lengths).astype(np.float32)
    return SparseRows(idx, vals, np.asarray(ptr, dtype=np.int64), dims)
