"""A multinomial logistic regression on sentence embeddings (and, optionally, hashed character n-grams), fitted
in numpy (pure, deterministic).

Contract: ``fit_softmax(X, y, classes, l2, iterations, learning_rate, grams=None, ...) -> SoftmaxHead``
fits weights by full-batch gradient descent from zero on the mean
cross-entropy plus an L2 penalty, so the same inputs always give the same head. With ``grams``
(:class:`gpufleet.safety.ngrams.SparseRows`, one row per row of X) the logits are
``scale·X·W + ngram_scale·G·V + b``: one head over both feature sets, the n-gram weights ``V`` with their own L2
penalty ``ngram_l2``. ``SoftmaxHead.probabilities(X, grams=None)`` returns one row of class probabilities per input
row (a head with n-gram weights needs the rows' n-grams).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.safety.ngrams import SparseRows


@dataclass(frozen=True)
class SoftmaxHead:
    weights: np.ndarray  # (dims, classes)
    bias: np.ndarray  # (classes,)
    scale: float
    ngram_weights: np.ndarray | None = None  # (buckets, classes)
    ngram_scale: float = 1.0

    def probabilities(self, x: np.ndarray, grams: SparseRows | None = None) -> np.ndarray:
        z = (x * self.scale) @ self.weights + self.bias
        if self.ngram_weights is not None:
            if grams is None:
                raise ValueError("this head reads character n-grams too")
            z = z + self.ngram_scale * grams.matmul(self.ngram_weights)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)


def fit_softmax(
    x: np.ndarray,
    y: np.ndarray,
    classes: int,
    *,
    l2: float,
    scale: float,
    iterations: int,
    learning_rate: float,
    grams: SparseRows | None = None,
    ngram_l2: float = 0.0,
    ngram_scale: float = 1.0,
    sample_weight: np.ndarray | None = None,
) -> SoftmaxHead:
    x = np.asarray(x, dtype=np.float32) * np.float32(scale)
    y = np.asarray(y)
    if len(x) != len(y) or not len(x):
        raise ValueError("fit_softmax needs one label per row and at least one row")
    if y.min() < 0 or y.max() >= classes:
        raise ValueError("labels must be in [0, classes)")
    if grams is not None and len(grams) != len(x):
        raise ValueError("fit_softmax needs one n-gram row per row")
    target = np.eye(classes, dtype=np.float32)[y]
    sw = (
        None
        if sample_weight is None
        else np.asarray(sample_weight, dtype=np.float32) * np.float32(1.0 / float(np.sum(sample_weight)))
    )
    w = np.zeros((x.shape[1], classes), dtype=np.float32)
    b = np.zeros(classes, dtype=np.float32)
    v = np.zeros((grams.dims, classes), dtype=np.float32) if grams is not None else None
    for _ in range(iterations):
        z = x @ w + b
        if v is not None:
            z += ngram_scale * grams.matmul(v)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - target) / len(x) if sw is None else (p - target) * sw[:, None]
        w -= learning_rate * (x.T @ g + l2 * w)
        b -= learning_rate * g.sum(axis=0)
        if v is not None:
            v -= learning_rate * (ngram_scale * grams.t_matmul(g) + ngram_l2 * v)
    return SoftmaxHead(
        w.astype(np.float32), b.astype(np.float32), scale, None if v is None else v.astype(np.float32), ngram_scale
    )
