"""A multinomial logistic regression on sentence embeddings, fitted in numpy (pure, deterministic).

Contract: ``fit_softmax(X, y, classes, l2, iterations, learning_rate) -> SoftmaxHead``
fits weights by full-batch gradient descent from zero on the mean
cross-entropy plus an L2 penalty, so the same inputs always give the same head. ``SoftmaxHead.probabilities(X)`` returns one row of class
probabilities per input row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SoftmaxHead:
    weights: np.ndarray  # (dims, classes)
    bias: np.ndarray  # (classes,)
    scale: float

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        z = (x * self.scale) @ self.weights + self.bias
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)


def fit_softmax(
    x: np.ndarray, y: np.ndarray, classes: int, *, l2: float, scale: float, iterations: int, learning_rate: float
) -> SoftmaxHead:
    x = np.asarray(x, dtype=np.float32) * np.float32(scale)
    y = np.asarray(y)
    if len(x) != len(y) or not len(x):
        raise ValueError("fit_softmax needs one label per row and at least one row")
    if y.min() < 0 or y.max() >= classes:
        raise ValueError("labels must be in [0, classes)")
    target = np.eye(classes, dtype=np.float32)[y]
    w = np.zeros((x.shape[1], classes), dtype=np.float32)
    b = np.zeros(classes, dtype=np.float32)
    for _ in range(iterations):
        z = x @ w + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - target) / len(x)
        w -= learning_rate * (x.T @ g + l2 * w)
        b -= learning_rate * g.sum(axis=0)
    return SoftmaxHead(w.astype(np.float32), b.astype(np.float32), scale)
