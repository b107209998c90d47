"""Hashed character n-grams (gpufleet.safety.ngrams) and the head that reads them beside the embedding."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.safety.head import fit_softmax
from gpufleet.safety.ngrams import hashed_ngrams


def test_rows_are_deterministic_unit_length_and_share_buckets_with_a_misspelling():
    a, b, c, empty = (
        hashed_ngrams(["a molotov cocktail", "a molotof cocktail", "a picnic by the lake", ""], 4096).take([i])
        for i in range(4)
    )
    dense = [r.matmul(np.eye(4096, dtype=np.float32))[0] for r in (a, b, c, empty)]
    assert all(abs(float(np.linalg.norm(d)) - 1) < 1e-5 for d in dense[:3]) and not dense[3].any()
    assert dense[0] @ dense[1] > 0.6 > 0.2 > dense[0] @ dense[2]
    again = hashed_ngrams(["a molotov cocktail"], 4096)
    assert (again.indices == a.indices).all() and (again.values == a.values).all()
    with pytest.raises(ValueError):
        hashed_ngrams(["x"], 1000)


def test_sparse_products_match_the_dense_ones():
    rows = hashed_ngrams(["one two", "three", "", "one two three four"], 64)
    dense = rows.matmul(np.eye(64, dtype=np.float32))
    w = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    assert np.allclose(rows.matmul(w), dense @ w, atol=1e-5)
    assert np.allclose(rows.t_matmul(g), dense.T @ g, atol=1e-5)
    picked = rows.take(np.array([3, 0, 3]))
    assert np.allclose(picked.matmul(w), (dense @ w)[[3, 0, 3]], atol=1e-5)


def test_the_ngram_weights_separate_what_the_embedding_cannot():
    # identical embeddings: only the n-grams tell the two classes apart
    texts = ["bake a cake", "bake a pie", "build a bomb", "build a pipe bomb"]
    x, y = np.ones((4, 2), dtype=np.float32) / np.sqrt(2), np.array([0, 0, 1, 1])
    grams = hashed_ngrams(texts, 256)
    plain = fit_softmax(x, y, 2, l2=0.01, scale=10.0, iterations=200, learning_rate=0.5)
    both = fit_softmax(x, y, 2, l2=0.01, scale=10.0, iterations=200, learning_rate=0.5, grams=grams, ngram_scale=5.0)
    assert np.allclose(plain.probabilities(x)[:, 1], 0.5, atol=1e-3)
    p = both.probabilities(x, grams)[:, 1]
    assert p[2:].min() > 0.8 and p[:2].max() < 0.2
    with pytest.raises(ValueError):
        both.probabilities(x)
