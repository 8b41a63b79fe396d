"""Synthetic data shaped like sentence embeddings, with planted near copies and decoys.

Why not blobs: real embeddings are unit vectors that share a mean direction (the median
cosine of two random sentences is about 0.3), sit in clusters of very different sizes
and spreads, and vary along a few directions more than others. In such data k-means
cells have many borders within a small radius of every row, which is what breaks
partitioned searches that look fine on well-separated blobs.
"""

from __future__ import annotations

import numpy as np


def embeddings(n: int, dim: int = 384, clusters: int = 2000, seed: int = 0) -> np.ndarray:
    """(n, dim) float32 unit vectors: a shared direction (cos^2 0.29), one of ``clusters``
    topic directions with Zipf-like sizes (0.36) and anisotropic noise whose variance
    falls as 1/rank (0.35, x 0.6-1.4 per cluster). Median random-pair cosine ~0.3."""
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(dim)
    mean /= np.linalg.norm(mean)
    topics = rng.standard_normal((clusters, dim))
    topics /= np.linalg.norm(topics, axis=1, keepdims=True)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    scale = (np.arange(dim) + 1.0) ** -0.5
    weight = np.minimum(rng.zipf(1.3, clusters), 200).astype(float)
    topic = rng.choice(clusters, n, p=weight / weight.sum())
    spread = rng.uniform(0.6, 1.4, clusters)
    out = np.empty((n, dim), np.float32)
    for a in range(0, n, 100_000):
        t = topic[a:a + 100_000]
        noise = (rng.standard_normal((len(t), dim)) * scale) @ basis.T
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        v = (np.sqrt(0.29) * mean + np.sqrt(0.36) * topics[t]
             + (np.sqrt(0.35) * spread[t])[:, None] * noise)
        out[a:a + 100_000] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def rotated(v: np.ndarray, cos_distance: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each row of ``v`` turned, in a random direction, to the given cosine distance."""
    v = v.astype(np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    w = rng.standard_normal(v.shape)
    w -= (w * v).sum(axis=1, keepdims=True) * v
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    angle = np.arccos(1 - np.asarray(cos_distance, dtype=np.float64))[:, None]
    return np.cos(angle) * v + np.sin(angle) * w


def planted_copies(x: np.ndarray, copies: float = 0.05, decoys: float = 0.02,
                   near: tuple[float, float] = (0.001, 0.02),
                   outside: tuple[float, float] = (0.021, 0.03), seed: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``x`` plus near copies of a ``copies`` share of its rows at cosine distances
    uniform in ``near`` and decoys of a ``decoys`` share in ``outside``, shuffled; and
    the (m, 2) rows of every planted (original, copy) pair in the shuffled array."""
    rng = np.random.default_rng(seed)
    n = len(x)
    parts, sources = [x], []
    for share, (lo, hi) in ((copies, near), (decoys, outside)):
        src = rng.choice(n, int(n * share), replace=False)
        sources.append(src)
        parts.append(rotated(x[src], rng.uniform(lo, hi, len(src)), rng).astype(np.float32))
    out = np.concatenate(parts)
    perm = rng.permutation(len(out))
    where = np.empty(len(out), np.int64)
    where[perm] = np.arange(len(out))  # new row of each old row
    pairs = np.stack([np.concatenate(sources), np.arange(n, len(out))], axis=1)
    return out[perm], where[pairs]


def with_near_copies(x: np.ndarray, **kw) -> np.ndarray:
    """``planted_copies``'s array alone."""
    return planted_copies(x, **kw)[0]
